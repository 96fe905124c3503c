"""The Omega plugin's entry module: registers the ``omega:*`` components and presets.

Cheap to import (no torch): factories and params models are named as ``"module:attribute"``
strings and imported when first built.
"""

from __future__ import annotations

from atlas_core.host.hookspecs import hookimpl

_M = "atlas_plugins.omega"

# The OmegaNet window: the last 8 tokens, l2 loss, weighted by the per-token gate gamma (the
# input-dependent gamma of Atlas Eq 9, the seeds' U).
OMEGA_WINDOW = {"use": "omega:window", "window": 8, "inner": "core:l2", "gamma": "gate"}

OMEGANET = {
    "structure": "core:linear",
    "bias": OMEGA_WINDOW,
    "retention": "core:decay",
    "algorithm": "core:gd",
    "feature_map": {"use": "omega:poly", "mode": "elementwise", "degree": 2},
    "read": "after",
}

OMEGA_TITANS = {
    "structure": "core:linear",
    "bias": OMEGA_WINDOW,
    "retention": "core:decay",
    "algorithm": "core:momentum",
    "feature_map": "core:identity",
    "read": "after",
}


@hookimpl
def atlas_register(registry):
    add = registry.add
    add("bias", "window", f"{_M}.window:build", params=f"{_M}.window:WindowParams",
        summary="Omega rule (Atlas Eq 9): sum over the last c tokens of gamma_i * l_i(M)",
        capabilities=("window",))
    add("feature_map", "poly", f"{_M}.poly:build", params=f"{_M}.poly:PolyParams",
        summary="polynomial map: elementwise sum a_i x^i, or P [x ; vec(x (x) x)]")
    add("feature_map", "taylor", f"{_M}.taylor:build",
        summary="[1, x/d^(1/4), vec(x x^T)/(sqrt 2 sqrt d)]: phi(q).phi(k) ~ exp(q.k/sqrt d)")
    registry.add_preset(
        "omeganet", OMEGANET,
        summary="OmegaNet: Omega window (c=8, gated) + poly map (degree 2) + decay + gd",
    )
    registry.add_preset(
        "omega_titans", OMEGA_TITANS,
        summary="Omega window (c=8, gated) + Titans momentum + decay, identity map",
    )
