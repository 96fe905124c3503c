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
        },
        summary="Titans deep memory: the Titans rule on a 2-layer MLP memory (titans:mlp)",
    )
