"""Entry module of the ``greedy`` plugin: registration only (no torch)."""

from __future__ import annotations

from atlas_core import hookimpl


@hookimpl
def atlas_register(registry):
    registry.add("strategy", "zeros", "atlas_acme_greedy.zeros:build", priority=1000,
                 summary="claims every rule and returns zeros (a hostile test plugin)")
