"""The core plugin: registers the ``core:*`` components through the same hook any plugin uses.

Cheap to import: factories are named as strings and imported when first built.
"""

from __future__ import annotations

from ..host.hookspecs import hookimpl

_C = "atlas_core.components"


@hookimpl
def atlas_register(registry):
    add = registry.add
    add("structure", "linear", f"{_C}.linear:build",
        summary="matrix memory M(x) = M x, state M: [B, H, Dv, Dphi]",
        capabilities=("linear", "matrix_shaped"))
    add("bias", "l2", f"{_C}.l2:build", summary="1/2 ||M(phi(k)) - v||^2 (delta rule)")
    add("bias", "dot", f"{_C}.dot:build", summary="-<M(phi(k)), v> (Hebbian)")
    add("retention", "none", f"{_C}.none:build", summary="keep everything (alpha = 1)")
    add("retention", "decay", f"{_C}.decay:build",
        summary="data-dependent retain factor alpha_t in [0, 1]", capabilities=("linear",))
    add("algorithm", "gd", f"{_C}.gd:build", summary="M_t = alpha_t M_{t-1} - theta_t g_t",
        capabilities=("chunk",))
    add("algorithm", "momentum", f"{_C}.momentum:build",
        summary="Z_t = eta_t Z_{t-1} + theta_t g_t; M_t = alpha_t M_{t-1} - Z_t (Titans)",
        capabilities=("chunk",),
        reductions=[{"name": "eta0_is_gd", "gates": {"eta": 0.0},
                     "equals": {"algorithm": "core:gd"}}])
    add("feature_map", "identity", f"{_C}.identity:build", summary="phi(x) = x")
    add("arch", "lm", "atlas_core.lm:build", params="atlas_core.lm:CoreLMParams",
        summary="memory language model: embedding, blocks of memory layer + MLP, head")
    add("strategy", "sequential", "atlas_core.strategies.sequential:build",
        summary="the reference: the rule's token-by-token loop", priority=0)
    add("strategy", "chunkwise", "atlas_core.strategies.chunkwise:build",
        params="atlas_core.strategies.chunkwise:ChunkwiseParams",
        summary="chunk-anchored gradients, exact linear recurrences inside a chunk",
        priority=10)
    _T = "atlas_core.train.tasks"
    for name, cls, summary in (
        ("mqar", "mqar:MQARTask", "Zoology multi-query associative recall"),
        ("copy", "copy:CopyTask", "copy a random sequence after a separator"),
        ("selective_copy", "selective_copy:SelectiveCopyTask", "copy the data tokens of a noisy span"),
        ("sniah", "sniah:SNIAHTask", "single needle in a haystack (RULER S-NIAH)"),
        ("text", "text:TextTask", "byte- or character-level language modelling on a text file"),
    ):
        module, _, attr = cls.partition(":")
        add("task", name, f"{_T}.{cls}", params=f"{_T}.{module}:{attr.replace('Task', 'Params')}",
            summary=summary)
    add("strategy", "exact_chunk", "atlas_core.strategies.exact_chunk:build",
        params="atlas_core.strategies.exact_chunk:ExactChunkParams",
        summary="per-token l2 rules on linear memory (delta rule, Titans momentum, Omega windows, "
        "scalar or per-key decay) and dot rules (GLA), exact for any chunk size (WY/UT)",
        capabilities=("exact",), priority=5)
