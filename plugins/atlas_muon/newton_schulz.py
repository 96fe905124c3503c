"""Newton–Schulz orthogonalisation ``NS_k`` (docs/math.md, "Newton–Schulz"; Atlas Eq 32, Muon).

::

    X = G / (||G||_F + eps);  transpose if rows > cols
    repeat k times:  A = X X^T;  X = a X + (b A + c A A) X
    transpose back

with the Muon quintic ``(a, b, c) = (3.4445, -4.7750, 2.0315)``. The quintic pushes every singular
value of the normalised matrix towards 1 without converging there: after 5 steps singular values
in [0.05, 1] land in about [0.68, 1.14]. ``NS_k(G)`` approximates the orthogonal polar factor
``U V^T`` of ``G = U S V^T``; it keeps U and V and (roughly) erases S, hence the magnitude.

Shapes: ``G: [..., r, c]`` — any number of leading dimensions, each trailing matrix on its own
(a ``[B, H, d, d]`` momentum is orthogonalised per batch and head; a public implementation that
returns 3-D inputs unchanged silently skips NS, which is the bug this function exists to avoid).

Precision: the iteration runs in at least float32 (bf16 / fp16 in -> float32 compute -> cast
back; float32 and float64 keep their dtype), because the quintic's cancellations lose everything
in half precision. Differentiable: autograd goes through every iteration (the outer loop trains
through the inner one). A zero matrix gives zeros, and a finite gradient, thanks to ``eps``.

Each step is ``A = X X^T``, ``B = a I + b A + c A A`` and ``X <- B X``: three batched products, the
``a X`` term folded into the small r x r factor.
"""

from __future__ import annotations

import math
from typing import Sequence

import torch

DEFAULT_STEPS = 5
DEFAULT_COEFFICIENTS = (3.4445, -4.7750, 2.0315)
DEFAULT_EPS = 1e-7


def compute_dtype(dtype: torch.dtype) -> torch.dtype:
    """The dtype NS runs in for an input dtype: at least float32."""
    return torch.float32 if dtype in (torch.float16, torch.bfloat16) else dtype


def check_ns_args(steps: int, coefficients: Sequence[float], eps: float) -> tuple[float, float, float]:
    """Validate NS arguments (ValueError naming the argument); returns the coefficients."""
    if isinstance(steps, bool) or not isinstance(steps, int) or steps < 0:
        raise ValueError(f"steps={steps!r} must be an integer >= 0 (0 only normalises)")
    coeffs = tuple(coefficients)
    if len(coeffs) != 3 or not all(isinstance(x, (int, float)) and math.isfinite(x) for x in coeffs):
        raise ValueError(
            f"coefficients={coefficients!r} must be three finite numbers (a, b, c), e.g. the Muon "
            f"quintic {DEFAULT_COEFFICIENTS}"
        )
    if not (isinstance(eps, (int, float)) and math.isfinite(eps) and eps > 0):
        raise ValueError(f"eps={eps!r} must be a finite number > 0 (it keeps a zero matrix finite)")
    return float(coeffs[0]), float(coeffs[1]), float(coeffs[2])


def newton_schulz(
    G: torch.Tensor,
    steps: int = DEFAULT_STEPS,
    coefficients: Sequence[float] = DEFAULT_COEFFICIENTS,
    eps: float = DEFAULT_EPS,
) -> torch.Tensor:
    """``NS_k(G)`` per trailing matrix of ``G: [..., r, c]``; returns ``[..., r, c]`` in G's dtype.

    ``steps = 0`` only Frobenius-normalises (no orthogonalisation)."""
    if not isinstance(G, torch.Tensor):
        raise ValueError(f"G must be a torch.Tensor [..., rows, cols], got {type(G).__name__}")
    if G.dim() < 2:
        raise ValueError(f"G must have at least 2 dimensions [..., rows, cols], got shape {tuple(G.shape)}")
    if not G.is_floating_point():
        raise ValueError(f"G must be a floating-point tensor, got dtype {G.dtype}")
    a, b, c = check_ns_args(steps, coefficients, eps)
    X = G.to(compute_dtype(G.dtype))
    tall = X.shape[-2] > X.shape[-1]
    if tall:  # iterate on the wide orientation: X X^T is the smaller Gram matrix
        X = X.mT
    lead, (r, c_) = X.shape[:-2], X.shape[-2:]
    X = X.reshape(-1, r, c_)  # (N, r, c): one batch of matrices for the fused batched matmuls
    # per-matrix Frobenius norm (N, 1, 1); eps keeps a zero matrix at zero (no 0 / 0)
    X = X / (torch.linalg.matrix_norm(X, keepdim=True) + eps)
    for _ in range(steps):
        A = X @ X.mT  # (N, r, r), r = min(rows, cols)
        B = torch.baddbmm(A, A, A, beta=b, alpha=c)  # b A + c A A, fused
        # a X + B X = (a I + B) X: the a I goes on the small r x r side, so the step is one
        # product (baddbmm with X as its addend would first copy the r x c X into its output)
        B.diagonal(dim1=-2, dim2=-1).add_(a)
        X = B @ X
    X = X.reshape(*lead, r, c_)
    if tall:
        X = X.mT
    return X.to(G.dtype)
