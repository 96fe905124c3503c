"""Exact cumulative matrix products with a closed-form backward (seed 002, docs/math.md "Matrix
Recurrent Unit").

Forward, earlier factors on the left:

    H_t = H_{t-1} X_t,   H_0 = identity or the carried state,   so  H_t = H_0 X_1 X_2 ... X_t

Backward, for a loss L with incoming gradients dH_t = dL/dH_t:

    B_T = dH_T,   B_i = dH_i + B_{i+1} X_{i+1}^T          (a reverse scan)
    dL/dX_i = H_{i-1}^T B_i                               (H_{i-1} = H_0 for i = 1)
    dL/dH_0 = B_1 X_1^T

(the last line: ``dL/dH_0 = sum_t dH_t (X_1 ... X_t)^T = (sum_t dH_t (X_2 ... X_t)^T) X_1^T``).

The reverse recurrence ``b <- b A + c`` is affine, so it is a scan too. Each element is the map
``b -> b A + c``, stored as one stacked tensor ``E = [A; c]`` of shape ``[2d, d]``; running map 1
then map 2 gives ``[A1 A2; c1 A2 + c2] = E1 A2 + [0; c2]`` — the seed's 2x2 block matrices
``[[A, 0], [c, I]]`` without the blocks that are always 0 or I. In reversed time, element j
(for i = T + 1 - j) is ``A = X_{i+1}^T`` (0 for i = T) and ``c = dH_i``; the scan's c column is B.
Every strategy uses its own scan algorithm for both directions.

Tensor layout of the low-level functions here: time is dim -3,

    X:  [..., T, d, d]      h0: [..., d, d] or None (identity)      H: [..., T, d, d]

`mru_scan` takes the rule layout ``X: [..., T, H, d, d]``, ``h0: [..., H, d, d]``.

Only X, h0 and the forward output H are saved for the backward; the incoming gradient is read,
never written (it is copied into a fresh buffer before the scan).
"""

from __future__ import annotations

from typing import Callable

import torch
from torch.autograd.function import once_differentiable

from .scans import brent_kung, hillis_steele, sequential, sklansky


def _matmul(left: torch.Tensor, right: torch.Tensor) -> torch.Tensor:
    return left @ right


def _affine(left: torch.Tensor, right: torch.Tensor) -> torch.Tensor:
    """Compose ``b -> b A1 + c1`` (left, first) with ``b -> b A2 + c2`` (right, second).

    ``left, right: [..., n, 2d, d]`` stacked as ``[A; c]``; returns ``[A1 A2; c1 A2 + c2]``.
    """
    d = right.shape[-1]
    out = left @ right[..., :d, :]
    out[..., d:, :] += right[..., d:, :]
    return out


def _eye_like(X: torch.Tensor) -> torch.Tensor:
    """Identity ``[..., 1, d, d]`` broadcast over X's leading dims (a view, no copy)."""
    d = X.shape[-1]
    eye = torch.eye(d, dtype=X.dtype, device=X.device)
    return eye.expand(*X.shape[:-3], 1, d, d)


def scan_forward(scan: Callable, X: torch.Tensor, h0: torch.Tensor | None) -> torch.Tensor:
    """``H_t = h0 X_1 ... X_t`` via ``scan``; h0 is folded into the first factor."""
    y = X.clone(memory_format=torch.contiguous_format)  # the scan's work buffer; X is never written
    if h0 is not None:
        y[..., 0, :, :] = h0 @ X[..., 0, :, :]
    return scan(y, _matmul, inplace=True)


def scan_backward(
    scan: Callable,
    X: torch.Tensor,
    h0: torch.Tensor | None,
    H: torch.Tensor,
    dH: torch.Tensor,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Closed-form gradients ``(dL/dX, dL/dh0)`` from the forward output H and ``dH = dL/dH``."""
    d = X.shape[-1]
    # A_i = X_{i+1}^T, with A_T = 0 (no later factor): [..., T, d, d]
    A = torch.cat([X[..., 1:, :, :].mT, torch.zeros_like(X[..., :1, :, :])], dim=-3)
    # a fresh buffer [..., T, 2d, d]: dH is copied here, so the caller's gradient is never written
    E = torch.cat([A, dH.to(X.dtype).expand_as(X)], dim=-2).flip(-3)
    B = scan(E, _affine, inplace=True)[..., d:, :].flip(-3)  # [..., T, d, d]
    first = _eye_like(X) if h0 is None else h0.unsqueeze(-3)
    H_prev = torch.cat([first, H[..., :-1, :, :]], dim=-3)  # H_{i-1}: [..., T, d, d]
    dX = H_prev.mT @ B
    dh0 = B[..., 0, :, :] @ X[..., 0, :, :].mT
    return dX, dh0


def _cumprod_function(name: str, scan: Callable, doc: str) -> type[torch.autograd.Function]:
    """An autograd Function computing the cumulative product with ``scan`` forward and the
    closed-form backward (`scan_backward`) driven by the same scan."""

    def forward(ctx, X: torch.Tensor, h0: torch.Tensor | None) -> torch.Tensor:
        H = scan_forward(scan, X, h0)
        ctx.save_for_backward(X, h0, H)
        return H

    @once_differentiable
    def backward(ctx, dH: torch.Tensor):
        X, h0, H = ctx.saved_tensors
        dX, dh0 = scan_backward(scan, X, h0, H, dH)
        need_x, need_h0 = ctx.needs_input_grad[:2]
        return (dX if need_x else None), (dh0 if need_h0 and h0 is not None else None)

    return type(name, (torch.autograd.Function,), {
        "__doc__": doc, "__module__": __name__, "_scan": staticmethod(scan),
        "forward": staticmethod(forward), "backward": staticmethod(backward)})


HillisSteeleCumprod = _cumprod_function(
    "HillisSteeleCumprod", hillis_steele,
    "Cumulative product by Hillis–Steele scans, forward and reverse (ceil(log2 T) levels).")
BrentKungCumprod = _cumprod_function(
    "BrentKungCumprod", brent_kung,
    "Cumulative product by Brent–Kung scans, forward and reverse (< 2T products per scan).")
SklanskyCumprod = _cumprod_function(
    "SklanskyCumprod", sklansky,
    "Cumulative product by Sklansky scans, forward and reverse (ceil(log2 T) levels).")
SequentialCumprod = _cumprod_function(
    "SequentialCumprod", sequential,
    "The same closed-form backward driven by plain loops (T - 1 steps each way).")


FUNCTIONS: dict[str, type[torch.autograd.Function]] = {
    "sequential": SequentialCumprod,
    "hillis_steele": HillisSteeleCumprod,
    "brent_kung": BrentKungCumprod,
    "sklansky": SklanskyCumprod,
}


def cumprod_loop(X: torch.Tensor, h0: torch.Tensor | None = None) -> torch.Tensor:
    """The readable reference: ``H_t = H_{t-1} X_t`` one step at a time, plain autograd.

    ``X: [..., T, d, d]``, ``h0: [..., d, d]`` or None -> ``H: [..., T, d, d]``.
    """
    check_inputs(X, h0)
    H_t = h0
    out = []
    for t in range(X.shape[-3]):
        X_t = X[..., t, :, :]
        H_t = X_t if H_t is None else H_t @ X_t  # earlier factors on the left
        out.append(H_t)
    return torch.stack(out, dim=-3)


def cumprod(X: torch.Tensor, h0: torch.Tensor | None = None, strategy: str = "brent_kung") -> torch.Tensor:
    """``H_t = h0 X_1 ... X_t`` by the named scan, with the closed-form backward.

    ``X: [..., T, d, d]``, ``h0: [..., d, d]`` or None (identity) -> ``H: [..., T, d, d]``.
    ``strategy``: "loop" (plain autograd), or one of `FUNCTIONS`.
    """
    if strategy == "loop":
        return cumprod_loop(X, h0)
    if strategy not in FUNCTIONS:
        choices = ", ".join(["loop", *FUNCTIONS])
        raise ValueError(f"unknown MRU scan strategy={strategy!r}; choose one of {choices}")
    check_inputs(X, h0)
    return FUNCTIONS[strategy].apply(X, h0)


def check_inputs(X: torch.Tensor, h0: torch.Tensor | None) -> None:
    """Shapes of the time-at-dim--3 layout; ValueError naming the sizes."""
    if not isinstance(X, torch.Tensor) or X.dim() < 3:
        shape = tuple(X.shape) if isinstance(X, torch.Tensor) else type(X).__name__
        raise ValueError(f"X must be a tensor [..., T, d, d]; got {shape}")
    if X.shape[-1] != X.shape[-2]:
        raise ValueError(
            f"X must hold square matrices in its last two dims; got {X.shape[-2]} x {X.shape[-1]} "
            f"(X shape {tuple(X.shape)})"
        )
    if X.shape[-3] < 1:
        raise ValueError(f"X must have at least one time step; got T=0 (X shape {tuple(X.shape)})")
    if h0 is not None:
        want = (*X.shape[:-3], X.shape[-1], X.shape[-1])
        if tuple(h0.shape) != want:
            raise ValueError(
                f"initial state has shape {tuple(h0.shape)}; expected {want} for X of shape "
                f"{tuple(X.shape)}"
            )
        if h0.dtype != X.dtype or h0.device != X.device:
            raise ValueError(
                f"initial state is {h0.dtype} on {h0.device} but X is {X.dtype} on {X.device}"
            )


def mru_scan(
    X: torch.Tensor, h0: torch.Tensor | None = None, strategy: str = "brent_kung"
) -> torch.Tensor:
    """The rule layout: ``X: [..., T, H, d, d]``, ``h0: [..., H, d, d]`` -> ``H: [..., T, H, d, d]``."""
    if not isinstance(X, torch.Tensor) or X.dim() < 4:
        shape = tuple(X.shape) if isinstance(X, torch.Tensor) else type(X).__name__
        raise ValueError(f"X must be a tensor [B, T, H, d, d]; got {shape}")
    # time to dim -3 so that each (batch, head) is an independent sequence: [..., H, T, d, d]
    out = cumprod(X.movedim(-4, -3), h0, strategy)
    return out.movedim(-3, -4)
