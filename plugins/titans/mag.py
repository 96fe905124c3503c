"""``titans:mag``: Memory as Gate (Titans Sec 4.2; seeds 000 and 003).

For a block that carries memory, with ``h = RMSNorm(x)`` and learned persistent tokens
``p = [p_1 .. p_Np]`` (input-independent, ``[N_p, d_model]``)::

    x~ = p || h
    y  = SW-Attn*(x~)          # sliding-window attention; the prefix p is always visible
    m  = M(x~)                 # the memory layer reads the same sequence (p first)
    x  = x + W_o (norm(y) * sigmoid(norm(m)))      # the gate (x): both branches normalised
    x  = x + MLP(RMSNorm(x))

Only the token positions of ``y`` and ``m`` are kept (the memory processes p once, at the start
of a sequence, so p shapes its state). Blocks not in ``memory_layers`` are sliding-window
attention blocks (`attention.attention_block`).

Shapes: ``ids: [B, T]`` -> ``logits: [B, T, vocab_size]``. ``step`` carries, per block, the
attention cache (prefix + last window - 1 keys/values) and the memory state (`run_memory`).
"""

from __future__ import annotations

import torch
from torch import nn

from .attention import SlidingWindowAttention, attention_block, prefixed_memory
from .common import BranchGate, HybridParams, TitansLM, build_blocks, make_mlp, run_memory


class MAGBlock(nn.Module):
    """Takes ``cu_seqlens``: every document is a sequence of its own (p first)."""

    def __init__(self, p: HybridParams, memory) -> None:
        super().__init__()
        d = p.d_model
        self.persistent = nn.Parameter(0.02 * torch.randn(p.persistent_tokens, d))
        self.norm_in = nn.RMSNorm(d, eps=p.norm_eps)
        self.attn = SlidingWindowAttention(d, p.attn_heads or p.heads, p.window, p.rotary_base)
        self.memory = memory
        self.gate = BranchGate(d, p.norm_eps)
        self.norm_mlp = nn.RMSNorm(d, eps=p.norm_eps)
        self.mlp = make_mlp(p)  # [model] mlp: gelu or swiglu

    def forward(self, x: torch.Tensor, state, keep_state: bool, cu_seqlens=None):
        if cu_seqlens is not None:
            return self._packed(x, cu_seqlens), None
        B, T, _ = x.shape
        h = self.norm_in(x)
        attn_st, mem_st = (state["attn"], state["memory"]) if state else (None, None)
        y, attn_st = self.attn(h, attn_st, prefix=self.persistent, keep_state=keep_state)
        if state is None:  # the start of a sequence: the memory reads p first
            h = torch.cat([self.persistent.to(h.dtype).unsqueeze(0).expand(B, -1, -1), h], dim=1)
        m, mem_st = run_memory(self.memory, h, mem_st, keep_state=keep_state)
        x = x + self.gate(y, m[:, m.shape[1] - T :])
        x = x + self.mlp(self.norm_mlp(x))
        return x, ({"attn": attn_st, "memory": mem_st} if keep_state else None)

    def _packed(self, x: torch.Tensor, cu_seqlens: torch.Tensor) -> torch.Tensor:
        """Packed documents (``x: [1, T, d]``), each as `forward` from the start of a sequence."""
        h = self.norm_in(x)
        _, m, cu, tokens, _ = prefixed_memory(self.memory, h, self.persistent, cu_seqlens)  # p first
        x = x + self.gate(self.attn.packed(h, cu, self.persistent), m[:, tokens])
        return x + self.mlp(self.norm_mlp(x))


class MAG(TitansLM):
    context_parallel = False  # its attention mixes tokens across time


def build(params: HybridParams, ctx) -> MAG:
    p = params
    return MAG(p, build_blocks(p, ctx, lambda mem: MAGBlock(p, mem), lambda: attention_block(p),
                                arch="titans:mag"))
