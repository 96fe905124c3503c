"""Which rank forms which part of the middle slices' maps (context parallelism's ``affine`` mode).

Rank 0 needs no map (its initial memory is known) and the last rank's is applied by no rank, so
only the middle slices 1 .. R - 2 have maps to form, and with them the gradients ``g`` of their
outputs at their initial memory (`atlas_core.distributed.context`). Left to their own ranks, those
ranks carry that work alone while rank 0 and the last rank carry none. A map composes over
consecutive pieces of a slice (``P = P_b P_a``, ``C = C_a P_b^T + C_b``), and so does ``g``
(``g = h_a + h_b P_a``), so the work splits by tokens: `map_plan` cuts the middle slices, taken
end to end, into R consecutive pieces of about equal length, piece j formed by rank j (a piece
that crosses a slice boundary becomes one piece per slice). At R = 4 rank 0 forms the map of the
first half of slice 1, rank 1 that of the second half, rank 2 and rank 3 those of slice 2's
halves: every rank forms ``(R - 2) / R`` of a slice's map instead of the middle ranks one each.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Piece:
    """Tokens ``start`` to ``end`` (exclusive) of rank ``slice``'s slice, whose map and ``g``
    rank ``worker`` forms."""

    slice: int
    start: int
    end: int
    worker: int


def map_plan(lengths: list[int], quantum: int = 1, balance: bool = True) -> list[Piece]:
    """The pieces of the middle slices' maps, in sequence order. ``lengths``: every rank's slice
    length; ``quantum``: piece boundaries inside a slice fall on multiples of it from the slice's
    start (a rank reading its own piece from the chunk pieces of its run needs them on its chunk
    boundaries); ``balance`` False: each middle slice whole, by its own rank (maps that only the
    slice's own rank can form: probed ones)."""
    R = len(lengths)
    if quantum < 1:
        raise ValueError(f"quantum={quantum} must be at least 1")
    middle = list(range(1, R - 1))
    if not balance:
        return [Piece(s, 0, lengths[s], s) for s in middle if lengths[s]]
    starts, total = [], 0  # each middle slice's first token, counted over the middle slices
    for s in middle:
        starts.append(total)
        total += lengths[s]

    def cut(x: int) -> int:  # the boundary nearest x (middle coordinates) on a quantum
        for s, lo in zip(middle, starts):
            if x < lo + lengths[s] or s == middle[-1]:
                off = x - lo
                return lo + min(lengths[s], quantum * ((2 * off + quantum) // (2 * quantum)))
        return total

    cuts = [0]
    for j in range(1, R):
        cuts.append(max(cuts[-1], cut((2 * j * total + R) // (2 * R))))
    cuts.append(total)
    out = []
    for j in range(R):
        lo, hi = cuts[j], cuts[j + 1]
        for s, first in zip(middle, starts):  # the span's part in each slice it crosses
            a, b = max(lo, first), min(hi, first + lengths[s])
            if a < b:
                out.append(Piece(s, a - first, b - first, j))
    return out
