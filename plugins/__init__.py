"""Bundled plugins, installed under the namespaced import name ``atlas_plugins``."""
