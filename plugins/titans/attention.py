"""Attention for the Titans hybrids: the core's softmax attention (`atlas_core.attention`) with a
persistent-memory prefix and a sliding window.

- `rotary(x, pos, base)`: rotary position embedding (RoFormer), half-split pairs, on
  ``x: [B, H, n, Dh]`` at integer positions ``pos: [n]`` (the core's `rope` over the whole head).
- `SlidingWindowAttention`: causal attention in which a query at token position t sees the keys
  at positions ``t - window + 1 .. t`` (a real banded mask, through PyTorch's
  ``scaled_dot_product_attention``) and, always, a prefix of ``N_p`` persistent-memory tokens
  (Titans Sec 4: ``x~ = [p_1 .. p_Np] || x``). The prefix sits at positions ``0 .. N_p - 1`` and
  token t at ``N_p + t``. With a carried cache it continues a sequence: the cache holds the
  prefix's keys/values and the last ``window - 1`` token keys/values — never more, so decoding
  costs the same at every position.
- `AttentionBlock`: a pre-norm block ``x + SWA(norm(x)) ; x + MLP(norm(x))`` with its own
  persistent tokens: what a hybrid's blocks without memory are.
- Packed documents (``cu_seqlens``, `atlas_core.varlen`): `SlidingWindowAttention.packed` lets a
  token see its own document's prefix and the last ``window`` tokens of its own document, at the
  positions a call on that document alone gives them (queries in blocks, each over the keys of
  its band only); `with_prefix` puts a prefix before every document of a packed row.

Shapes: inputs ``x: [B, n, d_model]`` (the new tokens), ``prefix: [N_p, d_model]`` or
``[B, N_p, d_model]``; outputs ``[B, n, d_model]``.
"""

from __future__ import annotations

import torch
from torch import nn

from atlas_core.attention import SoftmaxAttention, band_mask, rope  # noqa: F401 - band_mask: MAC's

from .common import FeedForward, make_mlp


def rotary(x: torch.Tensor, pos: torch.Tensor, base: float) -> torch.Tensor:
    """Rotate feature pairs ``(x_i, x_{i + Dh/2})`` by ``pos * base^(-2i/Dh)``: ``[B, H, n, Dh]``."""
    return rope(x, pos, base)


class SlidingWindowAttention(SoftmaxAttention):
    """The core's attention with one key/value head per query head, the whole head rotated, a
    window of ``window`` keys a query, and no norm, bias or gate (``qkv``, ``out``)."""

    def __init__(self, d_model: int, heads: int, window: int, rotary_base: float) -> None:
        if window < 1:
            raise ValueError(f"window={window} must be >= 1")
        if d_model % heads or (d_model // heads) % 2:
            raise ValueError(f"d_model={d_model} / heads={heads} must be a whole, even head size")
        super().__init__(d_model, heads, window=window, rotary_base=rotary_base)


def with_prefix(h: torch.Tensor, prefix: torch.Tensor, cu: list[int]):
    """``prefix: [N_p, d]`` before every document of the packed row ``h: [1, T, d]``: returns
    ``(ext [1, T + N N_p, d], cu_ext (LongTensor), tokens [T], prefixes [N, N_p])``, the last two
    the rows of ``ext`` that hold the tokens and each document's prefix."""
    from atlas_core.varlen import document_ids

    T, dev, N, Np = h.shape[1], h.device, len(cu) - 1, prefix.shape[0]
    tokens = torch.arange(T, device=dev) + (document_ids(cu, dev) + 1) * Np
    first = torch.tensor(cu[:-1], device=dev) + torch.arange(N, device=dev) * Np  # doc i's prefix
    prefixes = first[:, None] + torch.arange(Np, device=dev)
    order = torch.empty(T + N * Np, dtype=torch.long, device=dev)
    order[tokens] = Np + torch.arange(T, device=dev)
    order[prefixes.reshape(-1)] = torch.arange(Np, device=dev).repeat(N)
    ext = torch.cat([prefix.to(h.dtype), h[0]], dim=0).index_select(0, order).unsqueeze(0)
    cu_ext = torch.tensor([c + i * Np for i, c in enumerate(cu)], dtype=torch.long, device=dev)
    return ext, cu_ext, tokens, prefixes


class AttentionBlock(nn.Module):
    """``x + SWA([p] || norm(x))``, then ``x + MLP(norm(x))``: a hybrid block without memory."""

    def __init__(self, d_model: int, heads: int, window: int, persistent: int, rotary_base: float,
                 mlp_ratio: float, eps: float, mlp: nn.Module | None = None) -> None:
        super().__init__()
        self.persistent = nn.Parameter(0.02 * torch.randn(persistent, d_model))
        self.norm_attn = nn.RMSNorm(d_model, eps=eps)
        self.attn = SlidingWindowAttention(d_model, heads, window, rotary_base)
        self.norm_mlp = nn.RMSNorm(d_model, eps=eps)
        self.mlp = mlp if mlp is not None else FeedForward(d_model, mlp_ratio)

    def forward(self, x: torch.Tensor, state, keep_state: bool, cu_seqlens=None):
        if cu_seqlens is not None:  # packed documents, each from the start (no state)
            from atlas_core.varlen import check_cu_seqlens

            cu = check_cu_seqlens(cu_seqlens, x.shape[1], x.shape[0])
            x = x + self.attn.packed(self.norm_attn(x), cu, self.persistent)
            return x + self.mlp(self.norm_mlp(x)), None
        y, state = self.attn(self.norm_attn(x), state, prefix=self.persistent, keep_state=keep_state)
        x = x + y
        return x + self.mlp(self.norm_mlp(x)), state


def attention_block(p) -> AttentionBlock:
    """The block of a hybrid model (MAG, MAL, MAC) that carries no memory (not in ``[model]
    memory_layers``), from the model's params."""
    return AttentionBlock(p.d_model, p.attn_heads or p.heads, p.window, p.persistent_tokens,
                          p.rotary_base, p.mlp_ratio, p.norm_eps, mlp=make_mlp(p))
