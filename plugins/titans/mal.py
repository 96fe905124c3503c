"""``titans:mal``: Memory as Layer (Titans Sec 4.3; seeds 000 and 003).

The paper writes ``x~ = p || x;  y = M(x~);  o = SW-Attn(y)``. As a pre-norm residual block that
carries the persistent prefix through both sub-layers (``z`` starts as ``p || x``)::

    z = z + M(RMSNorm(z))                  # the memory layer first (it reads p first)
    z = z + SW-Attn*(RMSNorm(z))           # sliding window; the first N_p positions of z are an
                                           # always-visible prefix
    x = z[N_p:];  x = x + MLP(RMSNorm(x))

Blocks not in ``memory_layers`` are sliding-window attention blocks (`attention.attention_block`).

Shapes: ``ids: [B, T]`` -> ``logits: [B, T, vocab_size]``. ``step`` carries, per block, the
memory state (`run_memory`) and the attention cache, whose prefix keys/values are those of the
memory's outputs at the persistent positions (computed once, at the start of a sequence).
"""

from __future__ import annotations

import torch
from torch import nn

from .attention import SlidingWindowAttention, attention_block, prefixed_memory
from .common import HybridParams, TitansLM, build_blocks, make_mlp, run_memory


class MALBlock(nn.Module):

    def __init__(self, p: HybridParams, memory) -> None:
        super().__init__()
        d = p.d_model
        self.persistent = nn.Parameter(0.02 * torch.randn(p.persistent_tokens, d))
        self.norm_mem = nn.RMSNorm(d, eps=p.norm_eps)
        self.memory = memory
        self.norm_attn = nn.RMSNorm(d, eps=p.norm_eps)
        self.attn = SlidingWindowAttention(d, p.attn_heads or p.heads, p.window, p.rotary_base)
        self.norm_mlp = nn.RMSNorm(d, eps=p.norm_eps)
        self.mlp = make_mlp(p)  # [model] mlp: gelu or swiglu

    def forward(self, x: torch.Tensor, state, keep_state: bool, cu_seqlens=None):
        if cu_seqlens is not None:
            return self._packed(x, cu_seqlens), None
        B = x.shape[0]
        Np = self.persistent.shape[0]
        first = state is None
        mem_st, attn_st = (None, None) if first else (state["memory"], state["attn"])
        z = torch.cat([self.persistent.to(x.dtype).unsqueeze(0).expand(B, -1, -1), x], 1) if first else x
        u, mem_st = run_memory(self.memory, self.norm_mem(z), mem_st, keep_state=keep_state)
        z = z + u
        prefix, z = (self.norm_attn(z[:, :Np]), z[:, Np:]) if first else (None, z)
        a, attn_st = self.attn(self.norm_attn(z), attn_st, prefix=prefix, keep_state=keep_state)
        x = z + a
        x = x + self.mlp(self.norm_mlp(x))
        return x, ({"attn": attn_st, "memory": mem_st} if keep_state else None)

    def _packed(self, x: torch.Tensor, cu_seqlens: torch.Tensor) -> torch.Tensor:
        """Packed documents (``x: [1, T, d]``), each as `forward` from the start of a sequence:
        every document gets its own ``p`` before it, and its attention its own prefix."""
        z, u, cu, tokens, prefixes = prefixed_memory(self.memory, x, self.persistent, cu_seqlens, self.norm_mem)
        z = z + u
        prefix = self.norm_attn(z[0, prefixes])  # [N, N_p, d]: each document's own
        z = z[:, tokens]
        x = z + self.attn.packed(self.norm_attn(z), cu, prefix)
        return x + self.mlp(self.norm_mlp(x))


class MAL(TitansLM):
    context_parallel = False  # its attention mixes tokens across time


def build(params: HybridParams, ctx) -> MAL:
    p = params
    return MAL(p, build_blocks(p, ctx, lambda mem: MALBlock(p, mem), lambda: attention_block(p),
                                arch="titans:mal"))
