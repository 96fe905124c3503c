"""``omega:poly``: polynomial feature maps (Atlas Sec 3.1, seed 000's ``poly_mode``).

Two modes, applied to keys and queries ``x: [..., Dk]``:

- ``mode = "elementwise"``: ``phi(x) = sum_{i=1}^{g} a_i x^i`` with elementwise powers; ``Dphi = Dk``.
  The coefficients ``a: [g]`` are fixed to 1 (``coefficients = "fixed"``, seed 000) or learned
  (``"learned"``, an ``nn.Parameter`` initialised at ``a_i = 1/i!`` as in Atlas, so that the map
  starts as the truncated series of ``exp(x) - 1``).
- ``mode = "tensor"``: ``phi(x) = P [x ; vec(x (x) x) ; ... ; vec(x^{(x) g})]`` with the Kronecker
  powers of x up to the degree g (g = 2 is seed 000's ``P [x ; vec(x (x) x)]``) and a projection
  ``P: [dim, Dk + Dk^2 + ... + Dk^g]`` to ``Dphi = dim`` (required). P is learned
  (``projection = "learned"``: an ``nn.Parameter``, initialised from torch's global RNG with
  standard deviation ``1/sqrt(fan_in)``) or fixed (``"fixed"``: a buffer drawn from a generator
  seeded with ``seed``, so the same spec always gives the same map).

The memory's key size follows Dphi: ``core:linear`` memory is ``[B, H, Dv, Dphi]``. Parameters are
cast to the input's dtype in `forward`, so a float32 map serves float64 inputs and gradients still
reach the parameters.
"""

from __future__ import annotations

import math
from typing import Literal

import torch
from einops import rearrange
from pydantic import Field, ValidationInfo, field_validator
from atlas_core.params import size_field
from torch import nn

from atlas_core.host.registry import Params
from atlas_core.knobs.feature_map import FeatureMap


class PolyParams(Params):
    """Parameters of ``omega:poly``."""

    mode: Literal["elementwise", "tensor"] = Field(
        "elementwise", description="'elementwise' (sum of powers) or 'tensor' (projected Kronecker powers)"
    )
    degree: int = size_field(2, "iterations", ge=1, description="g: the highest power (>= 1)")
    coefficients: Literal["learned", "fixed"] = Field(
        "learned", description="elementwise mode: learned a_i (init 1/i!) or fixed a_i = 1"
    )
    dim: int | None = size_field(None, "width", ge=1, validate_default=True,
        description="tensor mode: the output size Dphi of the projection (required there)",
    )
    projection: Literal["learned", "fixed"] = Field(
        "learned", description="tensor mode: a learned projection P or a fixed random one"
    )
    seed: int = Field(0, description="tensor mode with a fixed projection: the generator seed of P")

    @field_validator("dim")
    @classmethod
    def _dim_matches_mode(cls, dim: int | None, info: ValidationInfo) -> int | None:
        mode = info.data.get("mode")
        if mode == "tensor" and dim is None:
            raise ValueError("mode='tensor' needs the output size: set dim = <Dphi> (e.g. dim = 64)")
        if mode == "elementwise" and dim is not None:
            raise ValueError(
                "dim is only used with mode='tensor' (elementwise maps keep Dphi = Dk); remove it"
            )
        return dim


def _factorial_inverses(g: int) -> list[float]:
    return [1.0 / math.factorial(i) for i in range(1, g + 1)]


class PolyFeatureMap(FeatureMap):
    """Polynomial feature map; see the module docstring for the two modes."""

    def __init__(self, mode: str = "elementwise", degree: int = 2, *, coefficients: str = "learned",
                 dim: int | None = None, projection: str = "learned", seed: int = 0) -> None:
        super().__init__()
        if degree < 1:
            raise ValueError(f"degree={degree} must be >= 1")
        if mode not in ("elementwise", "tensor"):
            raise ValueError(f"mode={mode!r} must be 'elementwise' or 'tensor'")
        if mode == "tensor" and (dim is None or dim < 1):
            raise ValueError(f"mode='tensor' needs dim >= 1 (the output size), got dim={dim}")
        self.mode, self.degree, self.dim = mode, int(degree), dim
        self.coefficients, self.projection, self.seed = coefficients, projection, seed
        if mode == "elementwise":
            if coefficients == "learned":
                self.coef = nn.Parameter(torch.tensor(_factorial_inverses(self.degree)))
            else:
                self.register_buffer("coef", torch.ones(self.degree), persistent=False)
        # tensor mode: P [dim, fan_in], created by `bind` (a Parameter or a buffer)
        self.register_buffer("P", None)

    # -- sizes --------------------------------------------------------------------------------------
    def fan_in(self, d_in: int) -> int:
        """Tensor mode: the length of ``[x ; vec(x (x) x) ; ...]``, ``d + d^2 + ... + d^g``."""
        return sum(d_in**i for i in range(1, self.degree + 1))

    def out_dim(self, d_in: int) -> int:
        return d_in if self.mode == "elementwise" else int(self.dim)

    def bind(self, d_in: int) -> None:
        if self.d_in is not None:
            if self.d_in != d_in:
                raise ValueError(f"this feature map is bound to Dk={self.d_in}; got Dk={d_in}")
            return
        super().bind(d_in)
        if self.mode != "tensor":
            return
        n = self.fan_in(d_in)
        if self.projection == "learned":
            self.P = nn.Parameter(torch.randn(self.dim, n) / math.sqrt(n))
        else:
            gen = torch.Generator().manual_seed(self.seed)
            self.register_buffer("P", torch.randn(self.dim, n, generator=gen) / math.sqrt(n))

    # -- the map ------------------------------------------------------------------------------------
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """``x: [..., Dk] -> [..., Dphi]``."""
        if self.mode == "elementwise":
            a = self.coef.to(x.dtype)
            power, out = x, a[0] * x
            for i in range(1, self.degree):
                power = power * x  # x^(i+1), elementwise
                out = out + a[i] * power
            return out
        if self.d_in is None:
            self.bind(x.shape[-1])
        if x.shape[-1] != self.d_in:
            raise ValueError(f"this feature map is bound to Dk={self.d_in}; got x of shape {tuple(x.shape)}")
        parts, power = [x], x
        for _ in range(1, self.degree):
            # the next Kronecker power: vec(power (x) x), [..., d^i] -> [..., d^(i+1)]
            power = rearrange(power.unsqueeze(-1) * x.unsqueeze(-2), "... i j -> ... (i j)")
            parts.append(power)
        feats = torch.cat(parts, dim=-1)  # [..., d + d^2 + ... + d^g]
        return feats @ self.P.to(x.dtype).transpose(0, 1)  # [..., dim]

    def extra_repr(self) -> str:
        if self.mode == "elementwise":
            return f"mode='elementwise', degree={self.degree}, coefficients={self.coefficients!r}"
        return f"mode='tensor', degree={self.degree}, dim={self.dim}, projection={self.projection!r}"


def build(params: PolyParams | None, ctx) -> PolyFeatureMap:
    p = params or PolyParams()
    return PolyFeatureMap(p.mode, p.degree, coefficients=p.coefficients, dim=p.dim,
                          projection=p.projection, seed=p.seed)
