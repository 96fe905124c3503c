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
- `attention_block`: the core's pre-norm block (`atlas_core.lm.AttentionBlock`) ``x + SWA(norm(x)) ;
  x + MLP(norm(x))`` with its own persistent tokens: what a hybrid's blocks without memory are.
- Packed documents (``cu_seqlens``, `atlas_core.varlen`): `SlidingWindowAttention.packed` lets a
  token see its own document's prefix and the last ``window`` tokens of its own document, at the
  positions a call on that document alone gives them (queries in blocks, each over the keys of
  its band only); `with_prefix` puts a prefix before every document of a packed row, and
  `prefixed_memory` runs a memory layer over that row (MAG's and MAL's packed forward).

Shapes: inputs ``x: [B, n, d_model]`` (the new tokens), ``prefix: [N_p, d_model]`` or
``[B, N_p, d_model]``; outputs ``[B, n, d_model]``.
"""

from __future__ import annotations

import torch

from atlas_core.attention import SoftmaxAttention, rope
from atlas_core.lm import AttentionBlock

from .common import make_mlp, run_memory


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


def prefixed_memory(memory, h: torch.Tensor, prefix: torch.Tensor, cu_seqlens, norm=None):
    """The memory layer over every document of the packed row ``h: [1, T, d]`` with ``prefix``
    before it, each from the start of a sequence (MAG's and MAL's packed forward): returns
    ``(ext, m, cu, tokens, prefixes)``: ``ext`` the prefixed row and ``tokens``, ``prefixes`` its
    rows (`with_prefix`), ``m`` the memory's outputs over ``norm(ext)`` (``ext`` without ``norm``),
    ``cu`` the checked document bounds."""
    from atlas_core.varlen import check_cu_seqlens

    cu = check_cu_seqlens(cu_seqlens, h.shape[1], h.shape[0])
    ext, cu_ext, tokens, prefixes = with_prefix(h, prefix, cu)
    m, _ = run_memory(memory, ext if norm is None else norm(ext), None, keep_state=False, cu_seqlens=cu_ext)
    return ext, m, cu, tokens, prefixes


def attention_block(p) -> AttentionBlock:
    """The block of a hybrid model (MAG, MAL, MAC) that carries no memory (not in ``[model]
    memory_layers``), from the model's params: the core's pre-norm attention block with
    sliding-window attention and its own persistent tokens."""
    attn = SlidingWindowAttention(p.d_model, p.attn_heads or p.heads, p.window, p.rotary_base)
    return AttentionBlock(p.d_model, attn, p.norm_eps, make_mlp(p), persistent=p.persistent_tokens)
