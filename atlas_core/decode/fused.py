"""Fused projections for decoding: several ``nn.Linear`` that read the same input become one
matrix, so a token reads them in one matrix-vector product (`Fused`).

The fused matrix is the weights' only copy: each module's weight becomes a view of its rows, so
fusing costs no memory (fusing the same modules again finds their rows already in one matrix
and copies nothing) and the model keeps computing what it computed (its forward, its
``state_dict``). The fused bias is a copy (a module without a bias contributes zeros; a module's
bias may be multiplied by a mask first, as the memory layer's gate projection masks its
``no_bias`` rows), so the model's own biases are left as they are.

`matvec(W, x)` is the product a decode step runs for ``x: [B, K]`` and ``W: [N, K]``, the result
in ``x``'s dtype: on a CPU the compiled kernel of `atlas_core.decode.cpu_kernel` (float32
activations against float32 or bfloat16 weights, accumulated in float32), elsewhere or where it
is not available ``F.linear`` in the weights' dtype (the readable reference).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from . import cpu_kernel


def matvec(W: torch.Tensor, x: torch.Tensor, b: torch.Tensor | None = None,
           dtype: torch.dtype | None = None) -> torch.Tensor:
    """``x W^T + b`` for a few rows ``x: [B, K]``, in ``dtype`` (default: ``x``'s)."""
    out = dtype or x.dtype
    fn = cpu_kernel.kernel() if cpu_kernel.usable(W, x) else None
    if fn is not None:
        if x.dtype != torch.float32 or not x.is_contiguous():  # (checked here: a no-op call costs more)
            x = x.to(torch.float32).contiguous()
        y = fn(W, x)
        if b is not None:
            y += b
        return y if out == torch.float32 else y.to(out)
    return reference_matvec(W, x, b).to(out)


def reference_matvec(W: torch.Tensor, x: torch.Tensor, b: torch.Tensor | None = None) -> torch.Tensor:
    """`matvec` by ``F.linear`` in the weights' dtype (the kernel's reference)."""
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
        W = _fused_already(mods)
        has_bias = any(m.bias is not None for m in mods)
        b = torch.zeros(sum(self.sizes), dtype=first.dtype, device=first.device) if has_bias else None
        if W is None:
            W = torch.empty(sum(self.sizes), first.shape[1], dtype=first.dtype, device=first.device)
        start = 0
        with torch.no_grad():
            for i, (m, n) in enumerate(zip(mods, self.sizes)):
                if m.weight.data_ptr() != W[start].data_ptr():
                    W[start : start + n].copy_(m.weight)
                    m.weight = nn.Parameter(W[start : start + n], requires_grad=m.weight.requires_grad)
                if m.bias is not None:
                    b[start : start + n].copy_(m.bias * masks[i].to(m.bias.dtype) if i in masks else m.bias)
                start += n
        self.W, self.b = W, b

    def __call__(self, x: torch.Tensor) -> list[torch.Tensor]:
        """The modules' outputs for ``x: [B, K]``, in order."""
        return list(matvec(self.W, x, self.b).split(self.sizes, dim=-1))

    def joined(self, x: torch.Tensor, dtype: torch.dtype | None = None) -> torch.Tensor:
        """The modules' outputs side by side, ``[B, sum(sizes)]``, in ``dtype`` (default: ``x``'s)."""
        return matvec(self.W, x, self.b, dtype)


def _fused_already(mods: list[nn.Linear]) -> torch.Tensor | None:
    """The matrix ``mods``' weights already are consecutive rows of (an earlier `Fused` of the same
    modules), or None: fusing the same modules again costs nothing."""
    ws = [m.weight for m in mods]
    first = ws[0]
    offset = first.storage_offset()
    for w in ws:
        if (w.untyped_storage().data_ptr() != first.untyped_storage().data_ptr() or not w.is_contiguous()
                or w.storage_offset() != offset or w.dtype != first.dtype):
            return None
        offset += w.numel()
    return torch.as_strided(first, (sum(w.shape[0] for w in ws), first.shape[1]), (first.shape[1], 1))


__all__ = ["Fused", "matvec", "reference_matvec"]
