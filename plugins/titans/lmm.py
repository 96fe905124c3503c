"""``titans:lmm``: the Titans long-term memory module alone as the sequence mixer (Titans Sec 4,
"LMM"; seed 003 "Pure Titans").

It is the core's generic memory language model (``core:lm``, `atlas_core.lm`), registered under
the Titans name as well: blocks of ``x + MemoryLayer(RMSNorm(x))`` then ``x + MLP(RMSNorm(x))``.
"""

from __future__ import annotations

from atlas_core.lm import LanguageModel, LMParams
from atlas_core.lm import build as build_lm


def build(params: LMParams, ctx) -> LanguageModel:
    ctx.options.setdefault("arch", "titans:lmm")
    return build_lm(params, ctx)
