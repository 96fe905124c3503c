"""``miras:huber``: Yaad's Huber attentional bias (MIRAS, Behrouz et al. 2025, Eq 16 and 26).

With ``e = M(phi(k_t)) - v_t`` (``[..., Dv]``) and threshold ``delta > 0``:

- ``mode = "elementwise"`` (docs/math.md's convention, the default): the coordinate-wise Huber loss
  ``l = sum_i h(e_i)`` with ``h(x) = x^2 / 2`` for ``|x| <= delta`` and
  ``delta (|x| - delta / 2)`` beyond; its derivative is ``clip(e, -delta, delta)``.
- ``mode = "norm"``: the Huber loss of the error vector, ``||e||^2 / 2`` for ``||e|| <= delta`` and
  ``delta (||e|| - delta / 2)`` beyond; its derivative is ``e * min(1, delta / ||e||)``. The paper's
  Eq 26 switches on the norm in the same way but uses ``delta * sign(e)`` (an l1 gradient) in the
  outer branch, which jumps at the threshold; the norm form here is the gradient of a loss, and
  continuous.

The paper makes delta data-dependent (a projection of x_t); here it is a fixed param (a gate
would be one more input of the rule). For a delta beyond every error the bias is ``core:l2``
(the declared reductions ``large_delta_is_l2`` and ``norm_large_delta_is_l2``).

Shapes: ``pred, v: [B, H, N, Dv]`` (any leading axes); output the same shape.
"""

from __future__ import annotations

from typing import Literal

import torch
from pydantic import Field

from atlas_core.params import Params
from atlas_core.knobs import Bias


class HuberParams(Params):
    delta: float = Field(1.0, gt=0.0, description="threshold between the quadratic and the linear branch")
    mode: Literal["elementwise", "norm"] = Field(
        "elementwise", description="clip each coordinate (docs/math.md) or shrink the error vector by its norm"
    )


class HuberBias(Bias):
    def __init__(self, delta: float = 1.0, mode: str = "elementwise") -> None:
        self.delta = float(delta)
        self.mode = mode

    def _norm_scale(self, e: torch.Tensor) -> torch.Tensor:
        # min(1, delta / ||e||) without dividing by a zero norm (clamp keeps the gradient finite)
        sq = (e * e).sum(-1, keepdim=True).clamp_min(self.delta ** 2)
        return self.delta / sq.sqrt()

    def error(self, pred: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        e = pred - v
        if self.mode == "norm":
            return e * self._norm_scale(e)
        return e.clamp(-self.delta, self.delta)

    def loss(self, pred: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        e = pred - v
        d = self.delta
        if self.mode == "norm":
            n = (e * e).sum(-1).sqrt()
            return torch.where(n <= d, 0.5 * n * n, d * (n - 0.5 * d))
        a = e.abs()
        return torch.where(a <= d, 0.5 * e * e, d * (a - 0.5 * d)).sum(-1)

    def describe(self) -> str:
        return f"huber(delta={self.delta:g}, mode={self.mode})"


def build(params: HuberParams | None, ctx) -> HuberBias:
    params = params or HuberParams()
    return HuberBias(params.delta, params.mode)
