"""Fused projections for decoding: several ``nn.Linear`` that read the same input become one
matrix, so a token reads them in one matrix-vector product (`Fused`).

The fused matrix is the weights' only copy: each module's weight becomes a view of its rows, so
fusing costs no memory and the model keeps computing what it computed (its forward, its
``state_dict``). The fused bias is a copy (a module without a bias contributes zeros; a module's
bias may be multiplied by a mask first, as the memory layer's gate projection masks its
``no_bias`` rows), so the model's own biases are left as they are.

`matvec(W, x)` is the product a decode step runs for ``x: [B, K]`` and ``W: [N, K]``:
``F.linear`` in the weights' dtype (bfloat16 weights read bfloat16 activations, accumulated in
float32 by the library), the result in ``x``'s dtype.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn


def matvec(W: torch.Tensor, x: torch.Tensor, b: torch.Tensor | None = None) -> torch.Tensor:
    """``x W^T + b`` for a few rows ``x: [B, K]``, in ``x``'s dtype."""
    if W.dtype != x.dtype:
        return F.linear(x.to(W.dtype), W, b).to(x.dtype)
    return F.linear(x, W, b)


class Fused:
    """The linears ``mods`` (same input size and dtype) as one matrix; ``sizes`` their output
    rows. ``masks``: ``{index: mask}`` multiplies module ``index``'s bias (``[out_features]``)."""

    def __init__(self, mods: list[nn.Linear], masks: dict[int, torch.Tensor] | None = None) -> None:
        masks = masks or {}
        self.sizes = [m.out_features for m in mods]
        first = mods[0].weight
        W = torch.empty(sum(self.sizes), first.shape[1], dtype=first.dtype, device=first.device)
        has_bias = any(m.bias is not None for m in mods)
        b = torch.zeros(W.shape[0], dtype=first.dtype, device=first.device) if has_bias else None
        start = 0
        with torch.no_grad():
            for i, (m, n) in enumerate(zip(mods, self.sizes)):
                W[start : start + n].copy_(m.weight)
                m.weight = nn.Parameter(W[start : start + n], requires_grad=False)
                if m.bias is not None:
                    b[start : start + n].copy_(m.bias * masks[i].to(m.bias.dtype) if i in masks else m.bias)
                start += n
        self.W, self.b = W, b

    def __call__(self, x: torch.Tensor) -> list[torch.Tensor]:
        """The modules' outputs for ``x: [B, K]``, in order."""
        return list(matvec(self.W, x, self.b).split(self.sizes, dim=-1))


__all__ = ["Fused", "matvec"]
