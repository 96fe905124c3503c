"""Inclusive prefix scans over an associative, NON-commutative combine.

Seed 002 (mru-lm) and docs/math.md "Associative scan": the MRU state ``H_t = X_1 X_2 ... X_t`` is an
inclusive scan under matrix multiplication, so any prefix-scan network computes it in O(log T)
sequential steps. The same networks also run the reverse scan of the closed-form backward, whose
elements are affine maps (see `cumprod.py`), so every algorithm here is written against an
abstract ``combine``:

    combine(left, right) -> the element for "left first, then right"

Elements are stacked along the time axis, which is dim -3 of a tensor ``y: [..., T, r, c]``
(``r = c = d`` for matrices; ``r = 2d, c = d`` for the affine elements of the backward).
``combine`` is always called on whole batches of element pairs at once (one call = one parallel
step), so the number of ``combine`` calls IS the depth of the scan. `count_steps` measures it.

Algorithms (T any positive integer, not only a power of two):

    sequential      T - 1 steps, T - 1 combines          (the readable loop)
    hillis_steele   ceil(log2 T) steps, ~T log2 T work    (every position, every level)
    sklansky        ceil(log2 T) steps, ~T/2 log2 T work  (divide and conquer; fan-out from the
                                                           last element of each left half)
    brent_kung      <= 2 floor(log2 T) steps, < 2T work   (up-sweep builds a reduction tree,
                                                           down-sweep fills in the rest)

Order matters everywhere: ``combine`` always receives the EARLIER element on the left.

`brent_kung` and `sklansky` update a work buffer in place; by default it is a copy of ``y`` and the
caller's tensor is left alone (``inplace=True`` is for callers that own the buffer).
"""

from __future__ import annotations

from typing import Callable

import torch

Combine = Callable[[torch.Tensor, torch.Tensor], torch.Tensor]


def _time(y: torch.Tensor) -> int:
    if y.dim() < 3:
        raise ValueError(f"scan elements need shape [..., T, r, c]; got shape {tuple(y.shape)}")
    return y.shape[-3]


def sequential(y: torch.Tensor, combine: Combine, inplace: bool = False) -> torch.Tensor:
    """Left-to-right loop: ``out_t = combine(out_{t-1}, y_t)``. ``y: [..., T, r, c]``."""
    T = _time(y)
    out = [y[..., 0:1, :, :]]
    for t in range(1, T):
        out.append(combine(out[-1], y[..., t : t + 1, :, :]))
    return torch.cat(out, dim=-3)


def hillis_steele(y: torch.Tensor, combine: Combine, inplace: bool = False) -> torch.Tensor:
    """Hillis–Steele: at offset k = 1, 2, 4, ... every position t >= k takes ``y[t-k] . y[t]``.

    After the level with offset k, ``y[t]`` holds the product of the last ``min(2k, t+1)`` inputs
    ending at t, so ceil(log2 T) levels give full prefixes. Out of place (each level reads only the
    previous level), so ``inplace`` is ignored.
    """
    T = _time(y)
    k = 1
    while k < T:
        # positions t < k are already complete prefixes and are carried over unchanged
        y = torch.cat([y[..., :k, :, :], combine(y[..., : T - k, :, :], y[..., k:, :, :])], dim=-3)
        k *= 2
    return y


def sklansky(y: torch.Tensor, combine: Combine, inplace: bool = False) -> torch.Tensor:
    """Sklansky (divide and conquer): ceil(log2 T) levels, about T/2 combines per level.

    Invariant after the level with half-block s: each position holds the product from the start of
    its 2s-block up to itself. At that level every position in the right half of a 2s-block takes
    the last element of the left half on its left. Whole blocks are handled as one batched
    product through a ``[..., blocks, 2s, r, c]`` view (no gather or scatter); a final block cut
    short by the end of the sequence is just a shorter right half, so any T works without padding.
    """
    T = _time(y)
    y = y if inplace else y.clone()
    s = 1
    while s < T:
        nb = T // (2 * s)  # whole 2s-blocks
        pieces = []
        if nb:
            blocks = y[..., : nb * 2 * s, :, :].unflatten(-3, (nb, 2 * s))  # [..., nb, 2s, r, c]
            pieces.append((blocks[..., s - 1 : s, :, :], blocks[..., s:, :, :]))
        tail = nb * 2 * s + s  # first right-half position of the partial block, if it has one
        if tail < T:
            pieces.append((y[..., tail - 1 : tail, :, :], y[..., tail:, :, :]))
        # one combine call per level: the partial block's pairs are appended to the whole blocks'
        if len(pieces) == 2:
            (lb, rb), (lt, rt) = pieces
            left = torch.cat([lb.expand_as(rb).flatten(-4, -3), lt.expand_as(rt)], dim=-3)
            out = combine(left, torch.cat([rb.flatten(-4, -3), rt], dim=-3))
            n = rb.shape[-4] * rb.shape[-3]
            rb.copy_(out[..., :n, :, :].unflatten(-3, rb.shape[-4:-2]))
            rt.copy_(out[..., n:, :, :])
        else:
            left, right = pieces[0]
            # the right-hand side is computed before the write, so no target is read after it
            # is written
            right.copy_(combine(left.expand_as(right), right))
        s *= 2
    return y


def brent_kung(y: torch.Tensor, combine: Combine, inplace: bool = False) -> torch.Tensor:
    """Brent–Kung: an up-sweep (reduction tree) then a down-sweep, < 2T combines in all.

    In 1-based positions i: after the up-sweep, ``y[i]`` holds the product over
    ``(i - lowbit(i), i]``, so powers of two are complete prefixes. The down-sweep, half-block s
    from large to small, completes ``i = 3s, 5s, 7s, ...`` from the complete prefix at ``i - s``.
    """
    T = _time(y)
    y = y if inplace else y.clone()
    s = 1
    while 2 * s <= T:  # up-sweep: 1-based i = 2s, 4s, ... takes y[i - s] on its left
        n = T // (2 * s)
        tgt = slice(2 * s - 1, 2 * s * n, 2 * s)
        src = slice(s - 1, 2 * s * n - s, 2 * s)
        y[..., tgt, :, :] = combine(y[..., src, :, :], y[..., tgt, :, :])
        s *= 2
    s //= 2
    while s >= 1:  # down-sweep: 1-based i = 3s, 5s, ... takes the complete prefix at i - s
        if 3 * s <= T:
            n = (T - 3 * s) // (2 * s) + 1
            tgt = slice(3 * s - 1, 3 * s - 1 + 2 * s * n, 2 * s)
            src = slice(2 * s - 1, 2 * s - 1 + 2 * s * n, 2 * s)
            y[..., tgt, :, :] = combine(y[..., src, :, :], y[..., tgt, :, :])
        s //= 2
    return y


ALGORITHMS: dict[str, Callable[..., torch.Tensor]] = {
    "sequential": sequential,
    "hillis_steele": hillis_steele,
    "brent_kung": brent_kung,
    "sklansky": sklansky,
}


def get_algorithm(name: str) -> Callable[..., torch.Tensor]:
    if name not in ALGORITHMS:
        raise ValueError(f"unknown scan algorithm {name!r}; choose one of {', '.join(ALGORITHMS)}")
    return ALGORITHMS[name]


def count_steps(name: str, T: int) -> tuple[int, int]:
    """Run the named scan on T scalar elements and measure it: (sequential steps, total combines).

    Steps are the number of ``combine`` calls (each call is one parallel level); combines are the
    number of element pairs combined in all calls (the work).
    """
    if T < 1:
        raise ValueError(f"T={T} must be >= 1")
    calls = [0, 0]

    def counting(left: torch.Tensor, right: torch.Tensor) -> torch.Tensor:
        calls[0] += 1
        calls[1] += right.shape[-3]
        return left + right  # any associative op: only the call pattern is measured

    get_algorithm(name)(torch.zeros(T, 1, 1), counting)
    return calls[0], calls[1]
