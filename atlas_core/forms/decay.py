"""Decay matrices for linear recurrences inside a chunk.

For gates ``a_1 .. a_C`` (retention alpha or momentum eta) the recurrence ``h_t = a_t h_{t-1} + x_t``
unrolls to ``h_t = P_t h_0 + sum_{j<=t} L[t, j] x_j`` with ``P_t = prod_{m<=t} a_m`` and
``L[t, j] = prod_{m=j+1}^{t} a_m`` (1 on the diagonal, 0 above it).

`L` is built from masked sums of log-gates (the "segsum" of Mamba-2): each entry is a sum over its
own segment, ``seg[t, j] = sum_{j<m<=t} log a_m``, so no ratio ``P_t / P_j`` of two tiny numbers is
ever formed. The sums are one product with a lower-triangular matrix of ones (a matrix product and
its backward are fast everywhere, where a cumulative sum's backward flips the tensor twice); a gate
of exactly 0 is clamped to ``log a = -1e4`` first (``0 * -inf`` would be NaN) and still gives exact
zeros, ``exp(-1e4) = 0`` (`safe_log`: its gradient stays finite there too).
"""

from __future__ import annotations

import math

import torch

_LOG_ZERO = -1.0e4


def safe_log(a: torch.Tensor) -> torch.Tensor:
    """``log a`` clamped at `_LOG_ZERO`, exactly `_LOG_ZERO` at ``a = 0`` (so ``exp`` of a segment
    through it is an exact 0) and with a finite gradient there: the log never sees a 0
    (``log(0)``'s gradient, inf, times a mask's 0 would be NaN). At exactly 0 the gradient with
    respect to that gate is 0; the sequential reference differentiates the product itself and
    gives the exact one."""
    pos = a > 0
    log_a = torch.log(torch.where(pos, a, torch.ones_like(a)))  # no log(0) in the graph
    return torch.where(pos, log_a, torch.full_like(a, _LOG_ZERO)).clamp(min=_LOG_ZERO)


def log_tiny(a: torch.Tensor) -> torch.Tensor:
    """``log a`` floored at ``log(tiny)`` (-87 in float32, -708 in float64), with a finite
    gradient at ``a = 0``. For running sums of logs: `safe_log`'s -1e4 would cost every later
    difference of the sums float32 precision (about 1e-3 after a gate of 0); e^-87 is 0 in all
    that follows."""
    return torch.log(a.clamp(min=torch.finfo(a.dtype).tiny))


def decay_floor(dtype: torch.dtype) -> float:
    """The smallest decay factor (and UT-transform coefficient) the chunked forms keep:
    ``tiny / eps * 2`` of the dtype (2^-102 in float32, 2^-118 in bfloat16, 2^-969 in float64);
    smaller ones are set to 0. What such a factor scales shrinks to the floor times its size or
    less, so only a result that small relative to the memory's values changes. Kept, these
    factors and their products fall into the subnormal range, which a CPU's matrix products
    handle in microcode: a Gated DeltaNet layer's forward was 1.6x slower with them (docs/math.md,
    "Negligible factors"). float16 keeps every factor."""
    if dtype == torch.float16:
        return 0.0
    fi = torch.finfo(dtype)
    return fi.tiny / fi.eps * 2.0


def log_floor(dtype: torch.dtype) -> float:
    """``log(decay_floor(dtype))`` (``-inf`` where every factor is kept)."""
    f = decay_floor(dtype)
    return math.log(f) if f > 0 else float("-inf")


def drop_negligible(x: torch.Tensor) -> torch.Tensor:
    """``x`` with the entries smaller in magnitude than `decay_floor` set to 0."""
    return x.masked_fill(x.abs() < decay_floor(x.dtype), 0.0)


def decay_matrix(a: torch.Tensor) -> torch.Tensor:
    """``a: [..., C]`` gates in [0, 1] -> ``L: [..., C, C]`` with ``L[t, j] = prod_{j<m<=t} a_m``,
    0 where that product is below `decay_floor`."""
    C = a.shape[-1]
    log_a = safe_log(a)
    i = torch.arange(C, device=a.device)
    below = i[:, None] > i[None, :]  # j < t
    x = log_a.unsqueeze(-1) * below.to(a.dtype)  # x[..., m, j] = log a_m where j < m
    seg = (i[:, None] >= i[None, :]).to(a.dtype) @ x  # seg[t, j] = sum_{m<=t} x[m, j]
    drop = ~(below | (i[:, None] == i[None, :])) | (seg < log_floor(a.dtype))  # above, or negligible
    return torch.exp(seg.masked_fill(drop, float("-inf")))

