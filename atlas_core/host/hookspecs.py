"""The hooks a plugin may implement.

A plugin is a module named by an entry point in the group ``atlas_core.plugins``; the entry name is
its namespace. It implements hooks with ``@atlas_core.hookimpl``. The module must stay cheap to
import (no torch kernels, no Triton, no compilation): heavy imports belong inside the factories it
registers, which are named lazily as ``"module:attribute"`` strings.

Every hook is documented in docs/plugins.md; a test fails when one is missing there.
"""

from __future__ import annotations

import pluggy

PROJECT = "atlas_core"

hookspec = pluggy.HookspecMarker(PROJECT)
hookimpl = pluggy.HookimplMarker(PROJECT)


@hookspec
def atlas_register(registry):  # pragma: no cover - a specification, not code
    """Register this plugin's components into ``registry`` (a `NamespacedRegistry` that only
    accepts names in the plugin's own namespace). Called once per plugin, in a deterministic
    order (the core first, then the others sorted by namespace)."""


@hookspec
def atlas_cli_apps():  # pragma: no cover
    """Return a list of ``(command_name, typer.Typer)`` pairs to mount under ``atlas``.
    The only way a plugin adds CLI commands."""


HOOK_NAMES = ("atlas_register", "atlas_cli_apps")
