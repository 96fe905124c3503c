"""The plugin host: hook specifications, typed registries, entry-point loading."""

from .hookspecs import hookimpl, hookspec
from .manager import PluginHost, PluginRecord, get_host, get_registry, reset_host
from .registry import (
    KINDS,
    BuildContext,
    Component,
    NamespacedRegistry,
    Params,
    Provider,
    Registry,
    split_use,
)

__all__ = [
    "KINDS", "BuildContext", "Component", "NamespacedRegistry", "Params", "PluginHost",
    "PluginRecord", "Provider", "Registry", "get_host", "get_registry", "hookimpl", "hookspec",
    "reset_host", "split_use",
]
