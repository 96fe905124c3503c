"""The Titans plugin: registers the ``titans:*`` components through the `atlas_register` hook.

Cheap to import: no torch here; factories and params models are named as ``"module:attribute"``
strings and imported when a component is first built or validated.
"""

from __future__ import annotations

from atlas_core.host.hookspecs import hookimpl

_T = "atlas_plugins.titans"


@hookimpl
def atlas_register(registry):
    add = registry.add
    add("structure", "mlp", f"{_T}.mlp:build", params=f"{_T}.mlp:MLPParams",
        summary="deep memory: per-head fast-weight MLP M(x) = x + W_L s(... s(W_1 x)), "
        "gradients through torch.func",
        capabilities=("matrix_shaped", "deep"))
    add("arch", "lmm", f"{_T}.lmm:build", params="atlas_core.lm:CoreLMParams",
        summary="Titans LMM: the core's memory language model (core:lm) under its Titans name")
    add("arch", "mag", f"{_T}.mag:build", params=f"{_T}.common:HybridParams",
        summary="memory as gate: sliding-window attention and memory branches, gated (Titans MAG)")
    add("arch", "mal", f"{_T}.mal:build", params=f"{_T}.common:HybridParams",
        summary="memory as layer: memory layer, then sliding-window attention (Titans MAL)")
    add("arch", "mac", f"{_T}.mac:build", params=f"{_T}.mac:MACParams",
        summary="memory as context: per segment retrieve, attend over [persistent | retrieved | "
        "segment], store, gate (Titans MAC)")
    registry.add_preset(
        "titans",
        knobs={
            "structure": "core:linear",
            "bias": "core:l2",
            "retention": "core:decay",
            "algorithm": "core:momentum",
            "feature_map": "core:identity",
        },
        summary="Titans (linear memory): l2 bias, decay retention, momentum (Titans Eq 13-14)",
    )
    registry.add_preset(
        "titans_deep",
        knobs={
            "structure": "titans:mlp",
            "bias": "core:l2",
            "retention": "core:decay",
            "algorithm": "core:momentum",
            "feature_map": "core:identity",
            # Titans' mini-batch gradient descent (Sec 3.2): gradients of a 16-token block at
            # the block's start, which core:chunkwise runs in parallel; anchor = 1 is per token
            "anchor": 16,
        },
        summary="Titans deep memory: the Titans rule on a 2-layer MLP memory (titans:mlp), "
        "gradients anchored per 16-token block",
    )
