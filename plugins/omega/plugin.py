"""The Omega plugin's entry module: registers the ``omega:*`` components and presets.

Cheap to import (no torch): factories and params models are named as ``"module:attribute"``
strings and imported when first built.
"""

from __future__ import annotations

from atlas_core.host.hookspecs import hookimpl

_M = "atlas_plugins.omega"

# The presets' window: the mean l2 loss over the last 8 tokens ("uniform", 1/c each; the Atlas
# spec seed's default). With the layer's default gates it is stable under core:chunkwise with
# 64-token chunks at any head size. The input-dependent gate of Atlas Eq 9 (seed 000's U) is one
# override away: bias = { use = "omega:window", window = 8, gamma = "gate" } (its window weight is
# a sum, about 0.95 c at the default gate bias, so the effective inner step is c times larger).
OMEGA_WINDOW = {"use": "omega:window", "window": 8, "inner": "core:l2", "gamma": "uniform"}

# What `atlas check` runs for each component (docs/plugins.md, check_cases).
# The gated window and the Taylor map are checked at Dk = 8: at the kit's default Dk = 3, random
# unit keys overlap so strongly that their larger effective step (a gated sum over the window;
# |phi(k)|^2 = 1 + 1/sqrt(3) + 1/6 for Taylor) overshoots inside a 64-token anchored momentum
# chunk and check_long_sequence_stable fails, while the sequential rule stays bounded.
WINDOW_CASES = [
    {"params": {"window": 4, "gamma": "uniform"}},
    {"params": {"window": 3, "gamma": "decay", "decay": 0.5}},
    {"params": {"window": 3, "gamma": "gate"}, "sizes": {"Dk": 8}},
]
POLY_CASES = [
    {"params": {"mode": "elementwise", "degree": 2}},
    {"params": {"mode": "tensor", "dim": 5}},
]
TAYLOR_CASES = [{"sizes": {"Dk": 8}}]

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
        capabilities=("window",), check_cases=WINDOW_CASES,
        nested={"inner": "bias"})  # a bad inner bias is reported beside bad window params
    add("feature_map", "poly", f"{_M}.poly:build", params=f"{_M}.poly:PolyParams",
        summary="polynomial map: elementwise sum a_i x^i, or P [x ; vec(x (x) x)]",
        check_cases=POLY_CASES)
    add("feature_map", "taylor", f"{_M}.taylor:build",
        summary="[1, x/d^(1/4), vec(x x^T)/(sqrt 2 sqrt d)]: phi(q).phi(k) ~ exp(q.k/sqrt d)",
        check_cases=TAYLOR_CASES)
    registry.add_preset(
        "omeganet", OMEGANET,
        summary="OmegaNet: Omega window (c=8, mean) + poly map (degree 2) + decay + gd",
    )
    registry.add_preset(
        "omega_titans", OMEGA_TITANS,
        summary="Omega window (c=8, mean) + Titans momentum + decay, identity map",
    )
