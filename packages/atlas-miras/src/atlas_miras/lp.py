"""``miras:lp``: Moneta's lp attentional bias (MIRAS, Behrouz et al. 2025, Sec 4 and Eq 24-25).

With the prediction error ``e = M(phi(k_t)) - v_t`` (shape ``[..., Dv]``) the bias is

    l(M) = 1/p * sum_i (e_i^2 + eps)^(p/2)          (1/p sum |e_i|^p when eps = 0; docs/math.md)

and its derivative with respect to the prediction, what `error` returns, is

    dl/dpred = e * (e^2 + eps)^((p - 2)/2)           (= sign(e) |e|^(p-1) when eps = 0).

For a linear memory the inner gradient is then ``error phi(k)^T`` (the structure applies the
VJP). The paper writes the loss without the 1/p (its gradient carries a factor p) and smooths
``sign`` with ``tanh`` and ``|x|`` with ``sqrt(x^2 + eps)``; here one smoothing, ``eps``, does
both, so the derivative is smooth everywhere for eps > 0 (the outer loop differentiates through
it: with p < 2 and eps = 0 its own derivative would be infinite at e = 0). With p = 2 it is
exactly ``core:l2`` for any eps (the declared reduction ``p2_is_l2``).

Shapes: ``pred, v: [B, H, N, Dv]`` (any leading axes); output the same shape.
"""

from __future__ import annotations

import torch
from pydantic import Field, model_validator

from atlas_core.params import Params
from atlas_core.knobs import Bias


class LpParams(Params):
    p: float = Field(3.0, ge=1.0, le=8.0, description="the norm's exponent (Moneta uses p = 3)")
    eps: float = Field(1e-6, ge=0.0, description="smoothing: |e| is sqrt(e^2 + eps)")

    @model_validator(mode="after")
    def _smooth_below_two(self) -> "LpParams":
        if self.p < 2.0 and self.eps <= 0.0:
            raise ValueError(f"p={self.p} < 2 needs eps > 0 (the derivative of |e|^(p-1) is infinite at e = 0)")
        return self


class LpBias(Bias):
    def __init__(self, p: float = 3.0, eps: float = 1e-6) -> None:
        self.p = float(p)
        self.eps = float(eps)
        # with p = 2 `error` is exactly pred - v (the fast l2 paths may serve it)
        self.error_kind = "l2" if self.p == 2.0 else None

    def error(self, pred: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        e = pred - v
        if self.p == 2.0:  # exactly the delta rule (no rounding from a power of 1)
            return e
        return e * (e * e + self.eps).pow((self.p - 2.0) / 2.0)

    def loss(self, pred: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        e = pred - v
        if self.p == 2.0:
            return 0.5 * (e * e).sum(-1)
        return (e * e + self.eps).pow(self.p / 2.0).sum(-1) / self.p

    def describe(self) -> str:
        return f"lp(p={self.p:g}, eps={self.eps:g})"


def build(params: LpParams | None, ctx) -> LpBias:
    params = params or LpParams()
    return LpBias(params.p, params.eps)
