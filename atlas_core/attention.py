"""Softmax attention: the core's one implementation, used by ``core:lm``'s attention blocks
(``[model] layers``, ``[model.attention]``) and by Titans' MAG, MAL and MAC.

For new tokens ``x: [B, n, d_model]`` (H query heads, G key/value heads, head size D)::

    q, k, v, g = split(W_qkv x [+ b])         # q: [B, n, H, D]; k, v: [B, n, G, D]; g: [B, n, H D]
    q, k = norm_q(q), norm_k(k)                # qk_norm "head": RMSNorm(D) per head;
                                               #         "all":  RMSNorm over every head's features
    q, k = rope(q, p), rope(k, p)              # the first R features of each head (partial rotary)
    o_t  = softmax(q_t K^T / sqrt(D)) V         # keys t - window + 1 .. t (all earlier without a
                                               # window), head h reading key/value head h // (H/G)
    y    = W_o (o * sigmoid(g))  [+ b_o]       # the gate only with output_gate = "sigmoid"

Rotary embedding is the rotate-half form (transformers' ``apply_rotary_pos_emb``, fla's
``RotaryEmbedding``): with ``f_i = base^(-2i / R)`` and ``x1, x2`` the halves of the first R
features, ``[x1 cos(p f) - x2 sin(p f), x2 cos(p f) + x1 sin(p f)]``; the angles in float32
(float64 for float64 inputs).

Training and prefill run PyTorch's ``scaled_dot_product_attention`` (grouped heads natively). A
call continues from a cache ``{"k", "v": [B, G, n_cached, D], "pos": int}``: the keys and values
of the tokens a later query may still see (all of them, or the last ``window - 1``), and the
number of tokens seen. Any split of a sequence into calls with the carried cache equals one call.

A persistent prefix (Titans Sec 4: ``N_p`` learned tokens before every sequence, always visible)
is passed as ``prefix: [N_p, d]`` (or ``[B, N_p, d]``): it sits at positions ``0 .. N_p - 1`` and
token t at ``N_p + t``; the cache then also holds its keys and values (``"pk"``, ``"pv"``).

Packed documents (``cu_seqlens``, `atlas_core.varlen`): `SoftmaxAttention.packed` gives every
token what a call on its document alone gives (queries in blocks, each over the keys of its band).
"""

from __future__ import annotations

from typing import Literal

import torch
import torch.nn.functional as F
from einops import rearrange
from pydantic import Field, model_validator
from torch import nn

from .params import Params, size_field

QKNorm = Literal["none", "head", "all"]


def rope(x: torch.Tensor, pos: torch.Tensor, base: float, dims: int | None = None) -> torch.Tensor:
    """``x: [B, H, n, D]`` with its first ``dims`` features (all when None; even) rotated to the
    positions ``pos: [n]`` (or ``[B, n]``); the rest passes through."""
    D = x.shape[-1]
    R = D if dims is None else dims
    if R == 0:
        return x
    work = torch.promote_types(x.dtype, torch.float32)
    inv_freq = 1.0 / (base ** (torch.arange(0, R, 2, device=x.device, dtype=work) / R))
    angle = pos.to(work)[..., None] * inv_freq  # [n, R/2] or [B, n, R/2]
    if angle.dim() == 3:
        angle = angle[:, None]  # [B, 1, n, R/2]
    cos, sin = angle.cos().to(work), angle.sin().to(work)
    rot = x[..., :R].to(work)
    x1, x2 = rot.chunk(2, dim=-1)
    out = torch.cat([x1 * cos - x2 * sin, x2 * cos + x1 * sin], dim=-1).to(x.dtype)
    return out if R == D else torch.cat([out, x[..., R:]], dim=-1)


def band_mask(q_pos: torch.Tensor, k_pos: torch.Tensor, window: int | None) -> torch.Tensor:
    """``[n_q, n_k]`` True where a query may see a key: ``q - window < k <= q`` (no lower
    bound when ``window`` is None)."""
    d = q_pos[:, None] - k_pos[None, :]
    ok = d >= 0
    return ok & (d < window) if window is not None else ok


class AttentionParams(Params):
    """``[model.attention]``: the softmax-attention blocks of ``core:lm`` (``[model] layers``)."""

    heads: int | None = size_field(None, "heads", ge=1, description="query heads (default: [model] heads)")
    kv_heads: int | None = size_field(None, "heads", ge=1, description="key/value heads, dividing heads "
                                      "(grouped-query attention; default: heads)")
    head_dim: int | None = size_field(None, "width", ge=1, description="per-head size (default: "
                                      "d_model / heads)")
    bias: bool = Field(False, description="the q, k, v (and gate) projection has a bias")
    out_bias: bool = Field(False, description="the output projection has a bias")
    qk_norm: QKNorm = Field("none", description="'head': RMSNorm of each head's q and k (Qwen3); 'all': "
                            "RMSNorm over all heads' features together (OLMo); 'none'")
    rotary: bool = Field(True, description="rotary position embedding on q and k (false: no positions)")
    rotary_fraction: float = Field(1.0, gt=0, le=1, description="the fraction of each head's features "
                                   "rotated (transformers' partial_rotary_factor)")
    rotary_base: float = Field(10000.0, gt=0, description="RoPE's base (rope_theta)")
    output_gate: Literal["none", "sigmoid"] = Field(
        "none", description="'sigmoid': the output multiplied by sigmoid(W_g x) before its projection "
        "(Qwen3.5's attn_output_gate)")
    window: int | None = size_field(None, "seq_len", ge=1, description="sliding window: keys per query, "
                                    "the query's own included (None: every earlier token)")
    block_norm: Literal["pre", "post"] = Field(
        "pre", description="'pre': x + attn(norm(x)), x + mlp(norm(x)); 'post': x + norm(attn(x)), "
        "x + norm(mlp(x)) (OLMo's attention blocks)")

    @model_validator(mode="after")
    def _groups(self) -> "AttentionParams":
        if self.heads is not None and self.kv_heads is not None and self.heads % self.kv_heads:
            raise ValueError(f"kv_heads={self.kv_heads} must divide heads={self.heads}")
        return self


def rotary_dims(head_dim: int, fraction: float, rotary: bool) -> int:
    """The rotated features of a head: ``int(head_dim * fraction)`` (transformers' rule), or 0."""
    return int(head_dim * fraction) if rotary else 0


class SoftmaxAttention(nn.Module):
    """Causal softmax attention with grouped key/value heads (see the module docstring).

    Parameters: ``qkv`` (rows: q ``H D``, k ``G D``, v ``G D``, then the gate ``H D`` with
    ``output_gate``), ``out``, and ``q_norm`` / ``k_norm`` with ``qk_norm``."""

    def __init__(self, d_model: int, heads: int, *, kv_heads: int | None = None, head_dim: int | None = None,
                 bias: bool = False, out_bias: bool = False, qk_norm: str = "none", norm_eps: float = 1e-6,
                 rotary: int | None = None, rotary_base: float = 10000.0, output_gate: str = "none",
                 window: int | None = None) -> None:
        super().__init__()
        G = kv_heads or heads
        if heads % G:
            raise ValueError(f"kv_heads={G} must divide heads={heads}")
        if head_dim is None and d_model % heads:
            raise ValueError(f"d_model={d_model} is not divisible by heads={heads}; set the head size")
        D = head_dim or d_model // heads
        R = D if rotary is None else rotary
        if R % 2 or R > D:
            raise ValueError(f"the rotated features ({R}) must be even and at most the head size {D}")
        if window is not None and window < 1:
            raise ValueError(f"window={window} must be >= 1")
        self.heads, self.kv_heads, self.head_dim, self.rotary, self.base = heads, G, D, R, rotary_base
        self.window, self.gated, self.qk_norm = window, output_gate == "sigmoid", qk_norm
        self.split = [heads * D, G * D, G * D] + ([heads * D] if self.gated else [])
        self.qkv = nn.Linear(d_model, sum(self.split), bias=bias)
        self.out = nn.Linear(heads * D, d_model, bias=out_bias)
        if qk_norm == "head":
            self.q_norm, self.k_norm = nn.RMSNorm(D, eps=norm_eps), nn.RMSNorm(D, eps=norm_eps)
        elif qk_norm == "all":
            self.q_norm, self.k_norm = nn.RMSNorm(heads * D, eps=norm_eps), nn.RMSNorm(G * D, eps=norm_eps)

    # -- projections ---------------------------------------------------------------------------
    def _project(self, x: torch.Tensor, pos: torch.Tensor):
        """q ``[B, H, n, D]``, k, v ``[B, G, n, D]`` (q and k rotated to ``pos``), gate or None."""
        parts = self.qkv(x).split(self.split, dim=-1)
        q, k, v = parts[:3]
        if self.qk_norm == "all":
            q, k = self.q_norm(q), self.k_norm(k)
        q = rearrange(q, "b n (h d) -> b h n d", d=self.head_dim)
        k = rearrange(k, "b n (h d) -> b h n d", d=self.head_dim)
        v = rearrange(v, "b n (h d) -> b h n d", d=self.head_dim)
        if self.qk_norm == "head":
            q, k = self.q_norm(q), self.k_norm(k)
        if self.rotary:
            q, k = rope(q, pos, self.base, self.rotary), rope(k, pos, self.base, self.rotary)
        return q, k, v, (parts[3] if self.gated else None)

    def project(self, x: torch.Tensor, pos: torch.Tensor):
        """q ``[B, H, n, D]``, k, v ``[B, G, n, D]``, q and k rotated to ``pos: [n]``."""
        return self._project(x, pos)[:3]

    def prefix_kv(self, prefix: torch.Tensor | None, like: torch.Tensor):
        """Keys/values of a persistent prefix (positions 0 .. N_p - 1), ``[B, G, N_p, D]``."""
        B = like.shape[0]
        if prefix is None or prefix.shape[-2] == 0:
            e = like.new_zeros(B, self.kv_heads, 0, self.head_dim)
            return e, e
        if prefix.dim() == 2:
            prefix = prefix.unsqueeze(0).expand(B, -1, -1)
        _, k, v = self.project(prefix.to(like.dtype), torch.arange(prefix.shape[1], device=like.device))
        return k, v

    def _finish(self, o: torch.Tensor, gate: torch.Tensor | None) -> torch.Tensor:
        o = rearrange(o, "b h n d -> b n (h d)")
        if gate is not None:
            o = o * torch.sigmoid(gate)
        return self.out(o)

    def _sdpa(self, q, k, v, mask=None, causal=False):
        gqa = {"enable_gqa": True} if self.kv_heads != self.heads else {}
        return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, is_causal=causal, **gqa)

    # -- a call --------------------------------------------------------------------------------
    def forward(self, x: torch.Tensor, cache: dict | None = None, *, prefix: torch.Tensor | None = None,
                keep_state: bool = True):
        """``x: [B, n, d]`` new tokens; ``cache`` from an earlier call or None (then ``prefix``
        gives the persistent tokens, if any). Returns ``(y [B, n, d], cache or None)``."""
        B, n, _ = x.shape
        dev = x.device
        with_prefix = prefix is not None or (cache is not None and "pk" in cache)
        if cache is None:
            pk, pv = self.prefix_kv(prefix, x)
            ck = cv = pk[:, :, :0]
            start = 0
        else:
            ck, cv, start = cache["k"], cache["v"], int(cache["pos"])
            pk, pv = (cache["pk"], cache["pv"]) if "pk" in cache else (ck[:, :, :0], cv[:, :, :0])
        Np, nc = pk.shape[2], ck.shape[2]
        pos = torch.arange(start, start + n, device=dev)  # token indices of the new tokens
        q, k, v, gate = self._project(x, pos + Np)
        K, V = (torch.cat([ck, k], dim=2), torch.cat([cv, v], dim=2)) if nc else (k, v)
        if Np == 0 and self.window is None and (nc == 0 or n == 1):
            o = self._sdpa(q, K, V, causal=nc == 0 and n > 1)  # plain causal (or one query: every key)
        else:
            k_pos = torch.arange(start - nc, start + n, device=dev)
            mask = band_mask(pos, k_pos, self.window)  # (n, cached + n)
            if Np:
                mask = torch.cat([torch.ones(n, Np, dtype=torch.bool, device=dev), mask], dim=1)
                K, V = torch.cat([pk, K], dim=2), torch.cat([pv, V], dim=2)
            o = self._sdpa(q, K, V, mask=mask)
        y = self._finish(o, gate)
        if not keep_state:
            return y, None
        if Np:
            K, V = K[:, :, Np:], V[:, :, Np:]
        if self.window is not None:  # a future query sees at most window - 1 earlier tokens
            tail = K.shape[2] - min(self.window - 1, K.shape[2])
            K, V = K[:, :, tail:], V[:, :, tail:]
        new = {"k": K, "v": V, "pos": start + n}
        if with_prefix:
            new.update(pk=pk, pv=pv)
        return y, new

    def packed(self, x: torch.Tensor, cu: list[int], prefix: torch.Tensor | None = None) -> torch.Tensor:
        """``x: [1, T, d]`` packed documents (boundaries ``cu``) -> ``y: [1, T, d]``, each document
        as `forward` on it alone with no cache. ``prefix``: None, ``[N_p, d]`` (every document's)
        or ``[N, N_p, d]`` (one per document)."""
        from .varlen import document_ids

        T, dev, N = x.shape[1], x.device, len(cu) - 1
        doc = document_ids(cu, dev)
        starts = torch.tensor(cu[:-1], device=dev)
        offset = torch.arange(T, device=dev) - starts[doc]
        Np = 0 if prefix is None else prefix.shape[-2]
        q, k, v, gate = self._project(x, offset + Np)
        pdoc = None
        if Np and prefix.dim() == 3:  # one prefix per document: a query sees its own
            _, pk, pv = self.project(prefix.to(x.dtype), torch.arange(Np, device=dev))
            pk, pv = (rearrange(t, "n h p d -> 1 h (n p) d") for t in (pk, pv))
            pdoc = torch.arange(N, device=dev).repeat_interleave(Np)
        else:
            pk, pv = self.prefix_kv(prefix, x)
        index, W = torch.arange(T, device=dev), self.window
        block = max(W or 0, 128)
        ys = []
        for a in range(0, T, block):  # queries a .. b - 1 see keys lo .. b - 1 at most
            b = min(T, a + block)
            lo = max(0, a - W + 1) if W is not None else int(starts[doc[a]])
            d = index[a:b, None] - index[None, lo:b]
            band = (d >= 0) & (doc[a:b, None] == doc[None, lo:b])
            if W is not None:
                band &= d < W
            if pdoc is None:
                PK, PV = pk, pv
                seen = torch.ones(b - a, pk.shape[2], dtype=torch.bool, device=dev)
            else:
                p0, p1 = int(doc[lo]) * Np, (int(doc[b - 1]) + 1) * Np
                PK, PV = pk[:, :, p0:p1], pv[:, :, p0:p1]
                seen = doc[a:b, None] == pdoc[None, p0:p1]
            ys.append(self._sdpa(q[:, :, a:b], torch.cat([PK, k[:, :, lo:b]], 2),
                                 torch.cat([PV, v[:, :, lo:b]], 2), mask=torch.cat([seen, band], dim=1)))
        return self._finish(torch.cat(ys, dim=2), gate)


def attention_from_params(p: AttentionParams, d_model: int, heads: int, eps: float) -> SoftmaxAttention:
    """The attention of a ``core:lm`` attention block, from ``[model.attention]`` (``heads``: the
    model's, the default query heads)."""
    H = p.heads or heads
    D = p.head_dim or (d_model // H if d_model % H == 0 else None)
    if D is None:
        raise ValueError(f"d_model={d_model} is not divisible by attention heads={H}; set "
                         "model.attention.head_dim")
    return SoftmaxAttention(d_model, H, kv_heads=p.kv_heads, head_dim=D, bias=p.bias, out_bias=p.out_bias,
                            qk_norm=p.qk_norm, norm_eps=eps,
                            rotary=rotary_dims(D, p.rotary_fraction, p.rotary), rotary_base=p.rotary_base,
                            output_gate=p.output_gate, window=p.window)


__all__ = ["AttentionParams", "SoftmaxAttention", "attention_from_params", "band_mask", "rope", "rotary_dims"]
