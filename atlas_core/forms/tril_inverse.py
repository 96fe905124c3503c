"""``(I + N)^-1`` for a batch of small strictly lower-triangular ``N`` by forward substitution:
`unit_lower_inverse`, with its own backward (``d(I + N)^-1 = -(I + N)^-1 dN (I + N)^-1``).

LAPACK's batched triangular solve runs one small system at a time (a few hundred microseconds
each on a CPU for 32 x 32 with a few hundred right-hand sides); the chunked delta rule has one such
system per head and chunk. Substituting row by row over the whole batch at once costs ``n``
batched products of growing width, and the right-hand sides then take one batched matrix product.
The result is the same inverse up to rounding (row ``i`` of ``T = (I + N)^-1`` is
``e_i - N[i, :i] T[:i]``, the arithmetic of a triangular solve on the identity).
"""

from __future__ import annotations

import torch


_BASE = 8  # diagonal blocks inverted row by row; larger blocks are merged two at a time


def _inverse(N: torch.Tensor) -> torch.Tensor:
    n = N.shape[-1]
    if n <= _BASE or n % _BASE:
        return _rows(N)
    lead = N.shape[:-2]
    nb = n // _BASE
    # the diagonal blocks, all at once: [..., nb, b, b]
    idx = torch.arange(nb, device=N.device)
    blocks = N.unflatten(-2, (nb, _BASE)).unflatten(-1, (nb, _BASE))  # [..., nb, b, nb, b]
    diag = blocks[..., idx, :, idx, :]  # advanced indexing puts nb first: [nb, ..., b, b]
    Tb = _rows(diag.movedim(0, -3).contiguous())  # [..., nb, b, b]
    T = torch.zeros_like(N)
    for j in range(nb):
        T[..., j * _BASE : (j + 1) * _BASE, j * _BASE : (j + 1) * _BASE] = Tb[..., j, :, :]
    size = _BASE
    while size < n:  # merge neighbouring inverted blocks: T21 = -T22 N21 T11
        for s in range(0, n, 2 * size):
            a, b, e = s, s + size, min(s + 2 * size, n)
            if b >= n:
                continue
            T[..., b:e, a:b] = -(T[..., b:e, b:e] @ (N[..., b:e, a:b] @ T[..., a:b, a:b]))
        size *= 2
    return T


def _rows(N: torch.Tensor) -> torch.Tensor:
    n = N.shape[-1]
    T = torch.zeros_like(N)
    T.diagonal(dim1=-2, dim2=-1).fill_(1.0)
    for i in range(1, n):  # row i of T: e_i - N[i, :i] T[:i] (T's own unit diagonal included)
        T[..., i, :i] = -(N[..., i : i + 1, :i] @ T[..., :i, :i])[..., 0, :]
    return T


class _UnitLowerInverse(torch.autograd.Function):
    @staticmethod
    def forward(ctx, N: torch.Tensor) -> torch.Tensor:  # noqa: D102
        T = _inverse(N)
        ctx.save_for_backward(T)
        return T

    @staticmethod
    def backward(ctx, gT: torch.Tensor) -> torch.Tensor:  # noqa: D102
        (T,) = ctx.saved_tensors
        return (-(T.mT @ gT @ T.mT)).tril(-1)  # N's diagonal and upper part are never read


def unit_lower_inverse(N: torch.Tensor) -> torch.Tensor:
    """``(I + N)^-1`` for ``N: [..., n, n]`` of which only the strictly lower part is read."""
    return _UnitLowerInverse.apply(N.tril(-1))


__all__ = ["unit_lower_inverse"]
