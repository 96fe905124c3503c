"""`atlas_core.distributed.map_plan`: the middle slices' map work cut into pieces, one run of
consecutive pieces per rank."""

from __future__ import annotations

import pytest

from atlas_core.distributed.map_plan import Piece, map_plan

LENGTHS = [[8, 8, 7, 7], [1024] * 4, [10, 10, 10], [1024, 1024, 1024], [100] * 6, [6, 0, 0, 6],
           [3, 2, 2, 3], [50, 7, 300, 1, 9, 40], [5, 5], [9]]


@pytest.mark.parametrize("lengths", LENGTHS)
@pytest.mark.parametrize("quantum", [1, 4, 32])
@pytest.mark.parametrize("foreign", [1, 2])
def test_pieces_cover_the_middle_slices_in_order(lengths, quantum, foreign):
    plan = map_plan(lengths, quantum, foreign=foreign)
    R = len(lengths)
    for s in range(1, R - 1):  # each middle slice exactly, in order, without gaps
        parts = [pc for pc in plan if pc.slice == s]
        assert bool(parts) == (lengths[s] > 0)
        assert [pc.start for pc in parts] == [0, *[pc.end for pc in parts[:-1]]][:len(parts)]
        assert (parts[-1].end if parts else 0) == lengths[s]
        assert all(pc.start < pc.end for pc in parts)
        # inside a slice, boundaries on the quantum (or the slice's end)
        assert all(pc.start % quantum == 0 for pc in parts)
    assert [pc.slice for pc in plan] == sorted(pc.slice for pc in plan)
    assert [pc.worker for pc in plan] == sorted(pc.worker for pc in plan)  # consecutive runs
    assert all(0 <= pc.worker < R for pc in plan)


@pytest.mark.parametrize("lengths", [[1024] * 4, [1000] * 3, [100] * 6, [64] * 8])
def test_every_rank_gets_its_share(lengths):
    R = len(lengths)
    plan = map_plan(lengths, 1)
    counts = [sum(pc.end - pc.start for pc in plan if pc.worker == r) for r in range(R)]
    assert sum(counts) == sum(lengths[1:-1])
    assert max(counts) - min(counts) <= R, counts  # the least largest share, the rest to the last


@pytest.mark.parametrize("lengths", [[1024] * 4, [999] * 3, [300] * 6, [64] * 8])
def test_foreign_tokens_weigh_more(lengths):
    """With another rank's tokens at twice the work of a rank's own, each rank's work (own
    tokens + 2 x others') is about equal."""
    R = len(lengths)
    plan = map_plan(lengths, 1, foreign=2)
    work = [sum((pc.end - pc.start) * (1 if pc.slice == r else 2) for pc in plan if pc.worker == r)
            for r in range(R)]
    assert max(work) - min(work) <= 2 * R, work  # the least largest share, the rest to the last
    assert max(work) < (2 * sum(lengths[1:-1])) / R  # less than with equal token counts


def test_four_ranks_split_each_middle_slice():
    assert map_plan([1024] * 4, 32) == [Piece(1, 0, 512, 0), Piece(1, 512, 1024, 1),
                                        Piece(2, 0, 512, 2), Piece(2, 512, 1024, 3)]
    # another rank's tokens at twice the work: a third of each middle slice goes to rank 0 / 3
    assert map_plan([1024] * 4, 32, foreign=2) == [Piece(1, 0, 352, 0), Piece(1, 352, 1024, 1),
                                                   Piece(2, 0, 672, 2), Piece(2, 672, 1024, 3)]


def test_unbalanced_plan_keeps_slices_whole():
    assert map_plan([5, 6, 0, 7, 5], balance=False) == [Piece(1, 0, 6, 1), Piece(3, 0, 7, 3)]
    assert map_plan([5, 5]) == [] and map_plan([5]) == []


def test_quantum_must_be_positive():
    with pytest.raises(ValueError, match="quantum=0 and foreign=1 must be at least 1"):
        map_plan([4, 4, 4], 0)
