"""Decay matrices for linear recurrences inside a chunk.

For gates ``a_1 .. a_C`` (retention alpha or momentum eta) the recurrence ``h_t = a_t h_{t-1} + x_t``
unrolls to ``h_t = P_t h_0 + sum_{j<=t} L[t, j] x_j`` with ``P_t = prod_{m<=t} a_m`` and
``L[t, j] = prod_{m=j+1}^{t} a_m`` (1 on the diagonal, 0 above it).

`L` is built from a masked cumulative sum of log-gates (the "segsum" of Mamba-2): each entry is
a sum over its own segment, so no ratio ``P_t / P_j`` of two tiny numbers is ever formed, and a gate
of exactly 0 gives exact zeros.
"""

from __future__ import annotations

import torch


def decay_matrix(a: torch.Tensor) -> torch.Tensor:
    """``a: [..., C]`` gates in [0, 1] -> ``L: [..., C, C]`` with ``L[t, j] = prod_{j<m<=t} a_m``."""
    C = a.shape[-1]
    log_a = torch.log(a)
    x = log_a.unsqueeze(-1).expand(*a.shape, C)  # x[..., t, j] = log a_t
    i = torch.arange(C, device=a.device)
    x = x.masked_fill(i[:, None] <= i[None, :], 0.0)  # keep j < t
    seg = x.cumsum(dim=-2)  # seg[t, j] = sum_{j<m<=t} log a_m
    return torch.exp(seg.masked_fill(i[:, None] < i[None, :], float("-inf")))  # 0 above


def cumulative(a: torch.Tensor) -> torch.Tensor:
    """``P_t = prod_{m<=t} a_m`` along the last axis (``[..., C]``)."""
    return torch.cumprod(a, dim=-1)
