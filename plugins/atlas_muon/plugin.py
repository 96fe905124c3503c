"""The ``atlas_muon`` plugin: registers the ``atlas_muon:*`` components through `atlas_register`.

Cheap to import: no torch here; factories and params models are named as ``"module:attribute"``
strings and imported when a component is first built or validated.

- ``atlas_muon:muon`` (algorithm): ``Z_t = eta_t Z_{t-1} + g_t``; ``M_t = alpha_t M_{t-1} -
  theta_t NS_k(Z_t)`` (Atlas Eq 32-33);
- ``atlas_muon:atlas_parallel`` (strategy): chunk-anchored gradients, momentum and retention as
  scans, Newton–Schulz batched over the chunk;
- presets ``atlas_muon:atlas`` (the Atlas paper's configuration: Omega window, polynomial feature
  map, decay, Muon on the deep ``titans:mlp`` memory) and ``atlas_muon:atlas_linear`` (the same on
  ``core:linear``).
"""

from __future__ import annotations

from atlas_core.host.hookspecs import hookimpl

_M = "atlas_plugins.atlas_muon"

#: The Atlas knobs shared by both presets (Atlas Sec 5): the Omega window over the last c = 8
#: tokens weighted by the input-dependent gate gamma (Atlas Eq 9; the same window as
#: omega:omeganet), a degree-2 polynomial feature map, data-dependent decay, Muon with 5
#: Newton-Schulz steps, read after the update.
ATLAS_KNOBS = {
    "bias": {"use": "omega:window", "window": 8, "inner": "core:l2", "gamma": "gate"},
    "retention": "core:decay",
    "algorithm": {"use": "atlas_muon:muon", "ns_steps": 5},
    "feature_map": {"use": "omega:poly", "mode": "elementwise", "degree": 2},
    "read": "after",
    # Atlas trains with chunked gradients (Sec 5, Eq 15): every gradient of a 16-token block is
    # taken at the block's start memory. Muon has no exact chunked form, so anchor = 1 (the
    # per-token rule) runs only sequentially.
    "anchor": 16,
}


# What `atlas check` runs for each component (the conformance kit's check_cases): Muon in the
# default composition, and with the cubic iteration on deep memory behind a gated window; the
# parallel strategy on the paper's preset (picked by the kit) and without recomputation.
MUON_CASES = [
    {"params": {}},
    {"params": {"ns_steps": 3, "coefficients": [1.5, -0.5, 0.0]},
     "rule": {"structure": "titans:mlp",
              "bias": {"use": "omega:window", "window": 3, "gamma": "gate"}}},
]
PARALLEL_CASES = [
    {"params": {}},
    {"params": {"chunk_size": 3, "checkpoint": False},
     "rule": {"use": "atlas_muon:atlas_linear", "anchor": 6}},
]


@hookimpl
def atlas_register(registry):
    registry.add(
        "algorithm", "muon", f"{_M}.muon:build", params=f"{_M}.params:MuonParams",
        summary="Z_t = eta_t Z_{t-1} + g_t; M_t = alpha_t M_{t-1} - theta_t NS_k(Z_t) "
        "(Atlas Muon, Newton-Schulz per weight matrix)",
        capabilities=("chunk", "needs_matrix_weights"), check_cases=MUON_CASES,
    )
    registry.add(
        "strategy", "atlas_parallel", f"{_M}.parallel:build",
        params=f"{_M}.params:AtlasParallelParams",
        summary="Atlas parallel training of Muon rules: anchored gradients, momentum and "
        "retention scans, batched Newton-Schulz, per-chunk recomputation",
        priority=20, check_cases=PARALLEL_CASES,
    )
    registry.add_preset(
        "atlas",
        knobs={"structure": "titans:mlp", **ATLAS_KNOBS},
        summary="Atlas (the paper's configuration): Omega window + polynomial map + decay + Muon "
        "on deep titans:mlp memory",
    )
    registry.add_preset(
        "atlas_linear",
        knobs={"structure": "core:linear", **ATLAS_KNOBS},
        summary="Atlas on linear (matrix) memory: Omega window + polynomial map + decay + Muon",
    )
