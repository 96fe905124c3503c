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

`Chain` and `Boundaries` carry the memories at the pieces' boundaries from rank to rank (forward)
and their gradients back, `exchange` a piece's inputs or output gradients to its rank; ``call``
there is the context-parallel call (its ``rank``, ``ranks`` and ``group``).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.distributed as dist


@dataclass(frozen=True)
class Piece:
    """Tokens ``start`` to ``end`` (exclusive) of rank ``slice``'s slice, whose map and ``g``
    rank ``worker`` forms."""

    slice: int
    start: int
    end: int
    worker: int


def map_plan(lengths: list[int], quantum: int = 1, balance: bool = True, foreign: int = 1) -> list[Piece]:
    """The pieces of the middle slices' maps, in sequence order. ``lengths``: every rank's slice
    length; ``quantum``: piece boundaries inside a slice fall on multiples of it from the slice's
    start (a rank reading its own piece from the chunk pieces of its run needs them on its chunk
    boundaries); ``foreign``: the work of a token of another rank's slice against one of the
    rank's own (2 where a rank's own pieces come from its run's chunk pieces and another's must
    be formed): consecutive runs of pieces, one per rank, of about equal work; ``balance``
    False: each middle slice whole, by its own rank (maps that only the slice's own rank can
    form: probed ones)."""
    R = len(lengths)
    if quantum < 1 or foreign < 1:
        raise ValueError(f"quantum={quantum} and foreign={foreign} must be at least 1")
    middle = list(range(1, R - 1))
    if not balance:
        return [Piece(s, 0, lengths[s], s) for s in middle if lengths[s]]
    starts, total = [], 0  # each middle slice's first token, counted over the middle slices
    for s in middle:
        starts.append(total)
        total += lengths[s]
    if not total:
        return []

    def where(x: int) -> tuple[int, int]:  # the middle slice holding token x, and its start
        for s, lo in zip(middle, starts):
            if x < lo + lengths[s] or s == middle[-1]:
                return s, lo
        return middle[-1], starts[-1]

    def take(j: int, x: int, budget: int) -> int:  # rank j's work of ``budget`` from token x on
        while x < total:
            s, lo = where(x)
            w = 1 if s == j else foreign
            n = min(lo + lengths[s] - x, budget // w)
            x, budget = x + n, budget - n * w
            if x < lo + lengths[s]:
                break
        return x

    def ends(budget: int) -> list[int]:  # each rank's last token + 1, every rank given budget
        x, out = 0, []
        for j in range(R):
            x = take(j, x, budget)
            out.append(x)
        return out

    lo, hi = 0, foreign * total  # the least budget that covers every token (work is monotone in it)
    while lo < hi:
        mid = (lo + hi) // 2
        lo, hi = (lo, mid) if ends(mid)[-1] >= total else (mid + 1, hi)

    def cut(x: int) -> int:  # the boundary nearest x (middle coordinates) on a quantum
        s, first = where(x)
        off = x - first
        return first + min(lengths[s], quantum * ((2 * off + quantum) // (2 * quantum)))

    cuts = [0]
    for x in ends(lo)[:-1]:
        cuts.append(max(cuts[-1], cut(x)))
    cuts.append(total)
    out = []
    for j in range(R):
        a_, b_ = cuts[j], cuts[j + 1]
        for s, first in zip(middle, starts):  # the span's part in each slice it crosses
            a, b = max(a_, first), min(b_, first + lengths[s])
            if a < b:
                out.append(Piece(s, a - first, b - first, j))
    return out


def exchange(call, sends: list, recvs: list) -> None:
    """Point-to-point messages: ``sends`` ``(to, tensor)``, ``recvs`` ``(from, buffer)``, posted
    in the same order on every rank (the plan's), then all waited for."""
    keep = [t.contiguous() for _, t in sends]
    work = [dist.isend(t, call.ranks[to], group=call.group) for (to, _), t in zip(sends, keep)]
    work += [dist.irecv(buf, call.ranks[frm], group=call.group) for frm, buf in recvs]
    for w in work:
        w.wait()


@dataclass
class Chain:
    """The boundaries of the map plan's pieces (`map_plan`), in sequence order: boundary 0 is the
    start of slice 1 (rank 0's final memory), boundary k + 1 the end of piece k. Forward, a
    boundary's memory is produced by one rank (rank 0, or the piece's worker) and received by the
    ranks that need it (the next piece's worker, the rank whose slice starts there); backward,
    the gradient at a boundary likewise, the other way. Point-to-point messages tagged by the
    boundary: each rank takes its steps in its own order, and every step waits only for a
    boundary before it (forward) or after it (backward)."""

    plan: list
    world: int

    def __post_init__(self):
        m, R = len(self.plan), self.world
        self.m = m
        self.start = {s: sum(pc.slice < s for pc in self.plan) for s in range(1, R)}
        self.end = {s: sum(pc.slice <= s for pc in self.plan) for s in range(R - 1)}

    def producer(self, k: int, backward: bool) -> int:
        if backward:
            return self.plan[k].worker if k < self.m else self.world - 1
        return self.plan[k - 1].worker if k > 0 else 0

    def consumers(self, k: int, backward: bool) -> set[int]:
        if backward:  # the previous piece's worker, the ranks whose slice ends here
            out = {s for s, e in self.end.items() if e == k}
            return out | ({self.plan[k - 1].worker} if k > 0 else set())
        out = {s for s, b in self.start.items() if b == k}  # the ranks whose slice starts here
        return out | ({self.plan[k].worker} if k < self.m else set())

    def tag(self, k: int, backward: bool) -> int:
        return 1 + k + (self.m + 1 if backward else 0)  # 0: the plan's exchanges


class Boundaries:
    """One rank's side of the chain's messages in one direction (`Chain`)."""

    def __init__(self, call, chain: Chain, backward: bool, like: torch.Tensor):
        self.call, self.chain, self.backward, self.like = call, chain, backward, like
        self.known, self.sent = {}, []

    def put(self, k: int, x: torch.Tensor) -> None:
        x = x.detach().contiguous()
        self.known[k] = x
        for c in sorted(self.chain.consumers(k, self.backward) - {self.call.rank}):
            self.sent.append(dist.isend(x, self.call.ranks[c], group=self.call.group,
                                        tag=self.chain.tag(k, self.backward)))

    def get(self, k: int) -> torch.Tensor:
        if k not in self.known:
            buf = torch.empty_like(self.like)
            dist.recv(buf, self.call.ranks[self.chain.producer(k, self.backward)], group=self.call.group,
                      tag=self.chain.tag(k, self.backward))
            self.known[k] = buf
        return self.known[k]

    def done(self) -> None:
        for w in self.sent:
            w.wait()
