"""The decode step's norms and greedy choice on its residual stream (`Norm`, `argmax`).

A decoder keeps its residual stream in float32 at least, whatever the weights' dtype: bfloat16
weights are widened in the products' registers (`atlas_core.decode.fused.matvec`), and rounding
the activations to bfloat16 between blocks would cost precision and, on a CPU without bfloat16
arithmetic, time (its bfloat16 elementwise work is several times slower than float32). Each norm
keeps a copy of its weight in the stream's dtype (a few KiB).

On float32 rows on a CPU the compiled ``csrc/rows.cpp`` runs the residual add with the RMSNorm
after it in one pass (and the argmax over the vocabulary); elsewhere, or without the kernel,
PyTorch's ``F.rms_norm`` (the readable reference the tests compare it with).
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

from . import cpu_kernel


def _ptr(t: torch.Tensor | None) -> int:
    return 0 if t is None else t.data_ptr()


class Norm:
    """``module`` (an ``nn.RMSNorm``; another norm runs as itself, in its weights' dtype) applied
    to rows of ``dtype`` over their last ``normalized_shape`` values."""

    def __init__(self, module: nn.Module, dtype: torch.dtype) -> None:
        self.module, self.dtype = module, dtype
        self.rms = isinstance(module, nn.RMSNorm)
        if self.rms:
            self.shape = tuple(module.normalized_shape)
            self.D = math.prod(self.shape)
            w = module.weight
            self.w = None if w is None else w.detach().to(dtype).contiguous()
            self.eps = float(module.eps if module.eps is not None else torch.finfo(dtype).eps)
            on_cpu = w is None or w.device.type == "cpu"
            self.fns = cpu_kernel.rows_kernels() if dtype == torch.float32 and on_cpu else None
        else:
            self.fns = None

    def _fast(self, x: torch.Tensor, r: torch.Tensor | None) -> bool:
        return (self.fns is not None and x.dtype == torch.float32 and x.device.type == "cpu" and x.is_contiguous()
                and (r is None or (r.dtype == torch.float32 and r.is_contiguous() and r.shape == x.shape)))

    def __call__(self, x: torch.Tensor, residual: torch.Tensor | None = None) -> torch.Tensor:
        """The norm of ``x``; with ``residual``, ``x += residual`` first (in place)."""
        if self._fast(x, residual):
            out = torch.empty_like(x)
            self.fns.add_rms_norm(x.data_ptr(), _ptr(residual), _ptr(self.w), self.eps, out.data_ptr(),
                                  x.numel() // self.D, self.D)
            return out
        if residual is not None:
            x += residual
        return self.reference(x)

    def add_normed(self, x: torch.Tensor, r: torch.Tensor) -> torch.Tensor:
        """``x += norm(r)`` in place (a post-norm block's residual); returns ``x``."""
        if self._fast(x, r):
            self.fns.add_normed(x.data_ptr(), r.data_ptr(), _ptr(self.w), self.eps, x.numel() // self.D, self.D)
            return x
        x += self.reference(r)
        return x

    def reference(self, x: torch.Tensor) -> torch.Tensor:
        """The norm in PyTorch, in ``x``'s dtype."""
        if self.rms:
            return F.rms_norm(x, self.shape, self.w, self.eps)
        dtype = next(self.module.parameters(), x).dtype
        return self.module(x.to(dtype)).to(x.dtype)


def argmax(logits: torch.Tensor) -> torch.Tensor:
    """``logits.argmax(-1)`` of ``[B, V]`` (the first of equal largest values; a NaN is the
    largest), by the compiled kernel on float32 rows on a CPU."""
    fns = (cpu_kernel.rows_kernels() if logits.device.type == "cpu" and logits.dtype == torch.float32
           and logits.dim() == 2 and logits.is_contiguous() and logits.shape[1] > 0 else None)
    if fns is None:
        return logits.argmax(-1)
    out = torch.empty(logits.shape[0], dtype=torch.long)
    fns.argmax(logits.data_ptr(), logits.shape[0], logits.shape[1], out.data_ptr())
    return out


__all__ = ["Norm", "argmax"]
