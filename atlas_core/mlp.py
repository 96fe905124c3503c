"""The gated MLP of a block (`SwiGLU`), shared by the dense MLP of `atlas_core.lm` and the shared
expert of `atlas_core.moe`."""

from __future__ import annotations

import torch
from torch import nn


class SwiGLU(nn.Module):
    """``x -> W_d (silu(W_g x) * W_u x)``, no biases (fla's ``GatedMLP``): ``[B, T, d] -> [B, T, d]``."""

    def __init__(self, d_model: int, hidden: int) -> None:
        super().__init__()
        self.gate = nn.Linear(d_model, hidden, bias=False)
        self.up = nn.Linear(d_model, hidden, bias=False)
        self.down = nn.Linear(hidden, d_model, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down(nn.functional.silu(self.gate(x)) * self.up(x))
