"""``titans:lmm``: the Titans long-term memory module alone as the sequence mixer (Titans Sec 4,
"LMM"; seed 003 "Pure Titans").

Block (pre-norm)::

    x = x + MemoryLayer(RMSNorm(x))        # blocks listed in memory_layers (default: all)
    x = x + MLP(RMSNorm(x))

A block that carries no memory is an MLP block. Embedding -> blocks -> RMSNorm -> head (tied to the
embedding unless ``tie_embeddings = false``).

Shapes: ``ids: [B, T]`` -> ``logits: [B, T, vocab_size]``. ``step(ids, state)`` carries, per
block, the memory layer's state at the last chunk boundary and the inputs since (`run_memory`),
so incremental decoding reproduces the full forward pass for every strategy.
"""

from __future__ import annotations

import torch
from torch import nn

from .common import FeedForward, LMParams, TitansLM, build_memory_layer, run_memory, spec_of


class LMMBlock(nn.Module):
    def __init__(self, d_model: int, mlp_ratio: float, eps: float, memory) -> None:
        super().__init__()
        self.memory = memory
        if memory is not None:
            self.norm_mem = nn.RMSNorm(d_model, eps=eps)
        self.norm_mlp = nn.RMSNorm(d_model, eps=eps)
        self.mlp = FeedForward(d_model, mlp_ratio)

    def forward(self, x: torch.Tensor, state, keep_state: bool):
        if self.memory is not None:
            y, state = run_memory(self.memory, self.norm_mem(x), state, keep_state=keep_state)
            x = x + y
        return x + self.mlp(self.norm_mlp(x)), state


class LMM(TitansLM):
    pass


def build(params: LMParams, ctx) -> LMM:
    spec = spec_of(ctx)
    p = params
    blocks = []
    for i in range(p.depth):
        mem = (build_memory_layer(spec, p.d_model, p.heads, arch="titans:lmm", registry=ctx.registry)
               if p.carries_memory(i) else None)
        blocks.append(LMMBlock(p.d_model, p.mlp_ratio, p.norm_eps, mem))
    return LMM(p, blocks)
