"""The ``fla`` plugin: flash-linear-attention's chunk ops as kernel backends.

One backend per fla op, each serving ``core:exact_chunk`` and ``core:chunkwise`` for the rules
the op computes exactly (`mapping.op_for`; docs/kernels.md, "fla's chunk kernels"):

- ``fla:delta_rule`` (``chunk_delta_rule``): zoo:deltanet, zoo:longhorn;
- ``fla:gated_delta_rule`` (``chunk_gated_delta_rule``): zoo:gated_deltanet, zoo:gated_delta_product;
- ``fla:kda`` (``chunk_kda``): zoo:kda;
- ``fla:gla`` (``chunk_gla``): zoo:gla;
- ``fla:simple_gla`` (``chunk_simple_gla``): zoo:simple_gla, zoo:retnet, zoo:linear_attention.

Priority 150, above ``cuda:chunk_linear`` (100): where fla has a kernel for a rule, fla's runs.
Each is available where fla imports and a CUDA device is present, and ``"auto"`` hands it calls
only once `atlas fla certify` (the command this plugin adds) has passed the conformance kit on
that device. The conformance cases (`atlas check fla`) run each backend on its presets at T = 70
(past fla's 64-token chunk) and head dims of 16.

Cheap to import: no torch and no fla here; factories are ``"module:attribute"`` strings.
"""

from __future__ import annotations

from atlas_core.host.hookspecs import hookimpl

_P = "atlas_plugins.fla_backend"
PRIORITY = 150
SIZES = {"T": 70, "Dk": 16, "Dv": 16}
#: op -> (its presets, the strategies it serves with the one the kit checks it under first)
BACKENDS = {
    "delta_rule": (("zoo:deltanet", "zoo:longhorn"), ("core:exact_chunk", "core:chunkwise")),
    "gated_delta_rule": (("zoo:gated_deltanet", "zoo:gated_delta_product"), ("core:exact_chunk", "core:chunkwise")),
    "kda": (("zoo:kda",), ("core:exact_chunk", "core:chunkwise")),
    "gla": (("zoo:gla",), ("core:chunkwise", "core:exact_chunk")),
    "simple_gla": (("zoo:simple_gla", "zoo:retnet", "zoo:linear_attention"), ("core:chunkwise", "core:exact_chunk")),
}
FLA_NAMES = {"delta_rule": "chunk_delta_rule", "gated_delta_rule": "chunk_gated_delta_rule",
             "kda": "chunk_kda", "gla": "chunk_gla", "simple_gla": "chunk_simple_gla"}


@hookimpl
def atlas_register(registry):
    for op, (presets, strategies) in BACKENDS.items():
        registry.add(
            "backend", op, f"{_P}.backend:build_{op}", priority=PRIORITY,
            strategy=strategies[0], strategies=strategies,
            check_cases=[{"rule": preset, "sizes": dict(SIZES)} for preset in presets],
            summary=f"fla's {FLA_NAMES[op]} (flash-linear-attention, Triton, GPU): "
                    f"{', '.join(presets)}; chosen by auto once certified on the device",
        )


@hookimpl
def atlas_cli_apps():
    from .cli import app

    return [("fla", app)]
