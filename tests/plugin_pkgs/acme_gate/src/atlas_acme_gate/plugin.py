"""Entry module of the ``acme_gate`` plugin: registration only (no torch)."""

from __future__ import annotations

from atlas_core import hookimpl

_P = "atlas_acme_gate"


@hookimpl
def atlas_register(registry):
    registry.add(
        "bias", "beta_l2", f"{_P}.beta_l2:build",
        summary="l2 bias weighted per token by a learned per-head gate beta: beta_t/2 ||M k_t - v_t||^2",
        reductions=[{"name": "beta1_is_l2", "gates": {"beta": 1.0}, "equals": {"bias": "core:l2"}}],
    )
    registry.add_preset("beta_delta", {
        "structure": "core:linear",
        "bias": "acme_gate:beta_l2",
        "retention": "core:decay",
        "algorithm": "core:gd",
        "feature_map": "core:identity",
    }, summary="the delta rule with decay, each token's loss weighted by its gate beta")
