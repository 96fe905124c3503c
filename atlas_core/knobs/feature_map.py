"""Feature map phi, applied to keys and queries before the memory sees them (docs/math.md).

``forward(x)`` maps ``[..., Dk] -> [..., Dphi]``; `out_dim` gives Dphi for an input size. A map with
learned coefficients is an ``nn.Module`` whose parameters belong to whoever holds the rule (the
memory layer registers them).
"""

from __future__ import annotations

import torch
from torch import nn


class FeatureMap(nn.Module):
    """Base class of feature maps; the identity."""

    def __init__(self) -> None:
        super().__init__()
        self.d_in: int | None = None

    def bind(self, d_in: int) -> None:
        self.d_in = d_in

    def out_dim(self, d_in: int) -> int:
        return d_in

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # noqa: D102
        return x

    def check_composition(self, rule) -> list[str]:
        """Problems with the composition this knob is placed in (a list of messages; empty
        when it fits). Called once, when the rule is built."""
        return []
