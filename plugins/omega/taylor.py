"""``omega:taylor``: the second-order Taylor feature map of the exponential kernel (Atlas' phi*,
the map of Based).

For ``x: [..., d]`` (d = Dk)::

    phi(x) = [ 1 ,  x / d^(1/4) ,  vec(x x^T) / (sqrt(2) sqrt(d)) ]        # [..., 1 + d + d^2]

so that ``phi(q) . phi(k) = 1 + q.k / sqrt(d) + (q.k)^2 / (2 d)``, the truncation after the
quadratic term of ``exp(q.k / sqrt(d))``: a linear memory over phi reads like (unnormalised)
softmax attention to second order. ``Dphi = 1 + d + d^2``; the memory is ``[B, H, Dv, Dphi]``.
The map has no parameters.
"""

from __future__ import annotations

import math

import torch
from einops import rearrange

from atlas_core.knobs.feature_map import FeatureMap


class TaylorFeatureMap(FeatureMap):
    """``phi(x) = [1, x / d^(1/4), vec(x x^T) / (sqrt(2) sqrt(d))]``."""

    def out_dim(self, d_in: int) -> int:
        return 1 + d_in + d_in * d_in

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """``x: [..., d] -> [..., 1 + d + d^2]``."""
        d = x.shape[-1]
        if self.d_in is not None and d != self.d_in:
            raise ValueError(f"this feature map is bound to Dk={self.d_in}; got x of shape {tuple(x.shape)}")
        one = torch.ones_like(x[..., :1])
        lin = x / d**0.25
        quad = rearrange(x.unsqueeze(-1) * x.unsqueeze(-2), "... i j -> ... (i j)")
        return torch.cat([one, lin, quad / (math.sqrt(2.0) * math.sqrt(d))], dim=-1)


def build(params, ctx) -> TaylorFeatureMap:
    return TaylorFeatureMap()
