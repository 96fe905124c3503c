"""The MRU layer: vectors to per-head square matrices, the MRU rule, and back (seed 002).

Sizes (seed 002's names): ``d_model`` = d_e = d_s, ``heads`` = h, head size ``d_h = d_model / h``,
matrix order ``d_o = sqrt(d_h)`` (d_h must be a perfect square), chunk size ``d_c = d_h / d_o = d_o``.

For ``x: [B, T, d_model]``:

1. ``Z_t = reshape(x_t, h, d_o, d_c) W_in``, one ``W_in[h]: [d_c, d_o]`` per head -> ``[B, T, h, d_o, d_o]``
   (seed 002 writes W_in as ``h x d_c x d_h``; the product only has the square shape the MRU needs
   with ``h x d_c x d_o``, which is what is used here);
2. ``X_t = exp(Z_t - Z_t^T)``, the matrix exponential of the skew-symmetric part (see below);
3. ``H_t = H_{t-1} X_t`` by the ``mru:mru`` rule and the chosen strategy, ``H_0 = I`` or the carried
   state;
4. ``y_t = reshape(H_t W_out, d_model)``, one ``W_out[h]: [d_o, d_c]`` per head.

Why ``X_t = exp(Z_t - Z_t^T)``: seed 002 uses ``X_t = Z_t`` directly, so ``||H_t||`` behaves like a
product of T random matrices and over- or underflows within a few hundred tokens unless the
network learns to keep every factor's spectrum at 1. The exponential of a skew-symmetric matrix is
orthogonal (a rotation, det +1), so every ``H_t`` is orthogonal too: ``||H_t||_2 = 1`` and
``||H_t||_F = sqrt(d_o)`` for every t, in exact arithmetic; in floating point the drift grows
only with the rounding error of each product (about 1e-7 per step in float32; the test at
T = 16384 checks it). The map is smooth, ``exp(0) = I`` and its derivative at 0 is the identity on
skew matrices, so with ``W_in = 0`` (``init_scale = 0``, the default) the layer starts as the
identity recurrence (``X_t = I``, ``H_t = I``) and still receives gradient. What it gives up: H
cannot shrink, so the unit forgets only by rotating old content out of the read directions, never
by decaying it. Half-precision inputs are computed in float32 (a long product of rounded rotations
drifts), and the exponential itself in float64 (see `transitions`): measured at T = 16384, d_o = 3,
the largest deviation of ``||H_t||_F^2`` from d_o is about 1e-2 with a float32 exponential and
about 1e-5 with a float64 one.

``forward(x, state=None) -> (y, state)`` with ``y: [B, T, d_model]`` and ``state = {"H":
[B, h, d_o, d_o]}``; two calls with the carried state equal one call.
"""

from __future__ import annotations

import math
from typing import Any

import torch
from einops import rearrange
from torch import nn

from atlas_core.errors import Issue, SpecError


def matrix_order(d_model: int, heads: int, path: str = "model") -> int:
    """``d_o = sqrt(d_model / heads)``; SpecError naming the sizes when it is not a whole number."""
    if heads < 1 or d_model < 1 or d_model % heads:
        raise SpecError(
            [Issue(f"{path}.heads", f"d_model={d_model} must be a positive multiple of heads", heads)]
        )
    d_h = d_model // heads
    d_o = math.isqrt(d_h)
    if d_o * d_o != d_h:
        ok = [h for h in range(1, d_model + 1) if d_model % h == 0 and math.isqrt(d_model // h) ** 2 == d_model // h]
        raise SpecError(
            [
                Issue(
                    f"{path}.heads",
                    f"the MRU head size d_model / heads = {d_model} / {heads} = {d_h} is not a perfect "
                    "square (each head is a d_o x d_o matrix)",
                    heads,
                    f"heads that work with d_model={d_model}: {ok or 'none'}",
                )
            ]
        )
    return d_o


class MRULayer(nn.Module):
    """``x: [B, T, d_model] -> (y: [B, T, d_model], {"H": [B, heads, d_o, d_o]})``."""

    def __init__(
        self,
        d_model: int,
        heads: int,
        *,
        rule: nn.Module | None = None,
        strategy: Any = None,
        init_scale: float = 0.0,
    ) -> None:
        super().__init__()
        from .rule import MRURule

        self.d_model, self.heads = d_model, heads
        self.d_o = matrix_order(d_model, heads)
        if init_scale < 0:
            raise ValueError(f"init_scale={init_scale} must be >= 0 (0 starts at X_t = I)")
        self.rule = rule if rule is not None else MRURule()
        # resolved and checked once, here: a forward makes no registry lookup
        self.strategy = self.rule.runner(strategy)
        d = self.d_o
        # W_in[h]: [d_c, d_o] (d_c = d_o); zero gives X_t = exp(0) = I at initialisation
        self.w_in = nn.Parameter(init_scale * torch.randn(heads, d, d) / math.sqrt(d))
        # W_out[h]: [d_o, d_c]; rows of an orthogonal H have unit norm, so this std gives y ~ 1
        self.w_out = nn.Parameter(torch.randn(heads, d, d) / math.sqrt(d))

    def transitions(self, x: torch.Tensor) -> torch.Tensor:
        """``x: [B, T, d_model] -> X: [B, T, heads, d_o, d_o]``, each X_t orthogonal."""
        cdtype = torch.float32 if x.dtype in (torch.float16, torch.bfloat16) else x.dtype
        xm = rearrange(x.to(cdtype), "b t (h r c) -> b t h r c", h=self.heads, r=self.d_o)
        Z = torch.einsum("bthrc,hco->bthro", xm, self.w_in.to(cdtype))  # [B, T, h, d_o, d_o]
        S = (Z - Z.mT).contiguous()  # skew-symmetric; matrix_exp fails on some einsum strides
        # float64: torch's float32 matrix_exp is off orthogonal by a systematic ~3e-7 per factor,
        # which compounds linearly over the product (about 1% at T = 16384); in float64 the only
        # error left is the final rounding to float32, which is random and grows like sqrt(T)
        exp_dtype = torch.float64 if cdtype == torch.float32 else cdtype
        return torch.linalg.matrix_exp(S.to(exp_dtype)).to(cdtype)

    def forward(self, x: torch.Tensor, state: dict | None = None, cu_seqlens=None):
        if not isinstance(x, torch.Tensor) or x.dim() != 3 or x.shape[-1] != self.d_model:
            shape = tuple(x.shape) if isinstance(x, torch.Tensor) else type(x).__name__
            raise ValueError(f"x must be [B, T, d_model={self.d_model}], got {shape}")
        X = self.transitions(x)
        # H: [B, T, h, d_o, d_o]; cu_seqlens: packed documents, each from its own start
        H, new_state = self.rule(X, state=state, strategy=self.strategy, cu_seqlens=cu_seqlens)
        y = torch.einsum("bthro,hoc->bthrc", H, self.w_out.to(H.dtype))
        y = rearrange(y, "b t h r c -> b t (h r c)")
        return y.to(x.dtype), new_state

    def init_state(self, batch: int, *, dtype=torch.float32, device=None) -> dict:
        return self.rule.init_state(batch, self.heads, self.d_o, dtype=dtype, device=device)

    def extra_repr(self) -> str:
        return f"d_model={self.d_model}, heads={self.heads}, d_o={self.d_o}, strategy={self.strategy!r}"
