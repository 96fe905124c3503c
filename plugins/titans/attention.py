"""Attention for the Titans hybrids: rotary positions, persistent-memory prefix, sliding window.

- `rotary(x, pos, base)`: rotary position embedding (RoFormer), half-split pairs, on
  ``x: [B, H, n, Dh]`` at integer positions ``pos: [n]``.
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
import torch.nn.functional as F
from einops import rearrange
from torch import nn

from .common import FeedForward, make_mlp


def rotary(x: torch.Tensor, pos: torch.Tensor, base: float) -> torch.Tensor:
    """Rotate feature pairs ``(x_i, x_{i + Dh/2})`` by ``pos * base^(-2i/Dh)``: ``[B, H, n, Dh]``."""
    dh = x.shape[-1]
    inv = base ** (-torch.arange(0, dh // 2, dtype=x.dtype, device=x.device) * 2.0 / dh)
    ang = pos.to(x.dtype)[:, None] * inv[None, :]  # (n, Dh/2)
    cos, sin = ang.cos(), ang.sin()
    x1, x2 = x[..., : dh // 2], x[..., dh // 2 :]
    return torch.cat([x1 * cos - x2 * sin, x1 * sin + x2 * cos], dim=-1)


def band_mask(q_pos: torch.Tensor, k_pos: torch.Tensor, window: int | None) -> torch.Tensor:
    """``[n_q, n_k]`` True where a query may see a key: ``q - window < k <= q`` (no lower
    bound when ``window`` is None)."""
    d = q_pos[:, None] - k_pos[None, :]
    ok = d >= 0
    return ok & (d < window) if window is not None else ok


class SlidingWindowAttention(nn.Module):
    def __init__(self, d_model: int, heads: int, window: int, rotary_base: float) -> None:
        super().__init__()
        if window < 1:
            raise ValueError(f"window={window} must be >= 1")
        if d_model % heads or (d_model // heads) % 2:
            raise ValueError(f"d_model={d_model} / heads={heads} must be a whole, even head size")
        self.heads, self.window, self.base = heads, window, rotary_base
        self.qkv = nn.Linear(d_model, 3 * d_model, bias=False)
        self.out = nn.Linear(d_model, d_model, bias=False)

    def project(self, x: torch.Tensor, pos: torch.Tensor):
        """q, k, v ``[B, H, n, Dh]`` with q and k rotated to positions ``pos: [n]``."""
        q, k, v = rearrange(self.qkv(x), "b n (three h d) -> three b h n d", three=3, h=self.heads)
        return rotary(q, pos, self.base), rotary(k, pos, self.base), v

    def prefix_kv(self, prefix: torch.Tensor | None, like: torch.Tensor):
        """Keys/values of the persistent prefix (positions 0 .. N_p - 1), ``[B, H, N_p, Dh]``."""
        B, dev = like.shape[0], like.device
        if prefix is None or prefix.shape[-2] == 0:
            e = like.new_zeros(B, self.heads, 0, like.shape[-1] // self.heads)
            return e, e
        if prefix.dim() == 2:
            prefix = prefix.unsqueeze(0).expand(B, -1, -1)
        _, k, v = self.project(prefix.to(like.dtype), torch.arange(prefix.shape[1], device=dev))
        return k, v

    def forward(self, x: torch.Tensor, cache: dict | None, *, prefix: torch.Tensor | None = None,
                keep_state: bool = True):
        """``x: [B, n, d]`` new tokens; ``cache`` from an earlier call or None (then ``prefix``
        gives the persistent tokens). Returns ``(y [B, n, d], cache or None)``."""
        B, n, _ = x.shape
        if cache is None:
            pk, pv = self.prefix_kv(prefix, x)
            ck = cv = pk[:, :, :0]
            start = 0
        else:
            pk, pv, ck, cv, start = cache["pk"], cache["pv"], cache["k"], cache["v"], cache["pos"]
        Np = pk.shape[2]
        dev = x.device
        pos = torch.arange(start, start + n, device=dev)  # token indices of the new tokens
        q, k, v = self.project(x, pos + Np)
        K, V = torch.cat([ck, k], dim=2), torch.cat([cv, v], dim=2)  # cached tokens, then new
        k_pos = torch.arange(start - ck.shape[2], start + n, device=dev)
        mask = torch.cat([
            torch.ones(n, Np, dtype=torch.bool, device=dev),  # the prefix is always visible
            band_mask(pos, k_pos, self.window),
        ], dim=1)  # (n, Np + cached + n)
        y = F.scaled_dot_product_attention(
            q, torch.cat([pk, K], dim=2), torch.cat([pv, V], dim=2), attn_mask=mask
        )  # (B, H, n, Dh)
        y = self.out(rearrange(y, "b h n d -> b n (h d)"))
        if not keep_state:
            return y, None
        keep = self.window - 1  # a future query sees at most window - 1 earlier tokens
        tail = K.shape[2] - min(keep, K.shape[2])
        return y, {"pk": pk, "pv": pv, "k": K[:, :, tail:], "v": V[:, :, tail:], "pos": start + n}


    def packed(self, x: torch.Tensor, cu: list[int], prefix: torch.Tensor | None = None) -> torch.Tensor:
        """``x: [1, T, d]`` packed documents (boundaries ``cu``) -> ``y: [1, T, d]``, each document
        as `forward` on it alone with no cache. ``prefix``: None, ``[N_p, d]`` (every document's)
        or ``[N, N_p, d]`` (one per document)."""
        from atlas_core.varlen import document_ids

        T, dev, N = x.shape[1], x.device, len(cu) - 1
        doc = document_ids(cu, dev)
        offset = torch.arange(T, device=dev) - torch.tensor(cu[:-1], device=dev)[doc]
        Np = 0 if prefix is None else prefix.shape[-2]
        q, k, v = self.project(x, offset + Np)
        pdoc = None
        if Np and prefix.dim() == 3:  # one prefix per document: a query sees its own
            _, pk, pv = self.project(prefix.to(x.dtype), torch.arange(Np, device=dev))
            pk, pv = (rearrange(t, "n h p d -> 1 h (n p) d") for t in (pk, pv))
            pdoc = torch.arange(N, device=dev).repeat_interleave(Np)
        else:
            pk, pv = self.prefix_kv(prefix, x)
        index, W = torch.arange(T, device=dev), self.window
        block = max(W, 128)
        ys = []
        for a in range(0, T, block):  # queries a .. b - 1 see keys lo .. b - 1 at most
            b, lo = min(T, a + block), max(0, a - W + 1)
            d = index[a:b, None] - index[None, lo:b]
            band = (d >= 0) & (d < W) & (doc[a:b, None] == doc[None, lo:b])
            if pdoc is None:
                PK, PV = pk, pv
                seen = torch.ones(b - a, pk.shape[2], dtype=torch.bool, device=dev)
            else:
                p0, p1 = int(doc[lo]) * Np, (int(doc[b - 1]) + 1) * Np
                PK, PV = pk[:, :, p0:p1], pv[:, :, p0:p1]
                seen = doc[a:b, None] == pdoc[None, p0:p1]
            ys.append(F.scaled_dot_product_attention(
                q[:, :, a:b], torch.cat([PK, k[:, :, lo:b]], 2), torch.cat([PV, v[:, :, lo:b]], 2),
                attn_mask=torch.cat([seen, band], dim=1)))
        return self.out(rearrange(torch.cat(ys, dim=2), "b h n d -> b n (h d)"))


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
