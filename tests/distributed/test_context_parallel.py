"""Context parallelism (`atlas_core.distributed.context_parallel`) equals one process.

One sequence of 30 tokens is split along time over 2 and 4 gloo processes on the CPU; outputs,
final state and the gradients of every input, gate, initial-state entry and learned parameter
equal one call of the rule on the whole sequence in one process (its reference loop,
``core:sequential``), to 1e-9 in float64. Affine mode: ``titans:titans`` (with and without an
anchor), the delta rule, ``omega:omeganet`` (an 8-token window carried across ranks), and the
per-token rules also under ``core:exact_chunk`` (each rank runs its slice on the chunk pieces
its map is read from); relay: ``titans:titans_deep`` with an anchor of 4 (slices start
inside anchor blocks). A 2-block ``core:lm`` model with every memory layer split
(`atlas_core.distributed.lm.enable`: the rule call and the short convolutions' carried inputs)
gives the logits and parameter gradients of the whole-sequence model.
"""

from __future__ import annotations

import pytest
import torch

import atlas_core as ac

from atlas_core.distributed import affine_reason, mode_for
from atlas_core.train.data_parallel import spawn

from . import cases


def _check(world: int, skip: tuple[str, ...] = ()) -> None:
    names = [name for name in cases.CASES if not name.startswith(skip)]
    got = spawn(cases.run_all, names, world, "cpu")
    _check_lm(got["lm"])
    for name in names:
        want = cases.reference(name)
        assert sorted(got[name]) == sorted(want), name
        for key, w in want.items():
            if w is None:
                assert got[name][key] is None, (name, key)
                continue
            torch.testing.assert_close(torch.from_numpy(got[name][key]), w, rtol=1e-9, atol=1e-9,
                                       msg=f"{name} {key} (R = {world})")


def _check_lm(got: dict) -> None:
    want = cases.lm_whole()
    assert sorted(got) == sorted(want)
    for key, w in want.items():
        torch.testing.assert_close(torch.from_numpy(got[key]), w, rtol=1e-9, atol=1e-9, msg=key)


def test_two_ranks_equal_one_process():
    _check(2)


def test_four_ranks_equal_one_process():
    _check(4)


def test_modes_follow_the_rule():
    assert mode_for(cases.build("titans")) == "affine"
    assert mode_for(cases.build("omeganet")) == "affine"
    assert mode_for(cases.build("delta")) == "affine"
    assert mode_for(cases.build("gated_deltanet")) == "affine"
    gla = ac.build_rule({"use": "zoo:gla"})
    assert mode_for(gla) == "relay" and "core:dot" in affine_reason(gla)
    deep = cases.build("titans_deep_anchor4")
    assert mode_for(deep) == "relay"
    assert "titans:mlp" in affine_reason(deep)
    with pytest.raises(ValueError, match="mode 'affine' needs a memory update affine"):
        mode_for(deep, "affine")
    with pytest.raises(ValueError, match="mode 'ring' is not a context-parallel mode"):
        mode_for(deep, "ring")


def test_three_and_five_ranks_equal_one_process():
    # the middle slices' maps in pieces spread over every rank (`map_plan`): at R = 3 one slice
    # in three pieces (the last rank's before its own slice), at R = 5 pieces that cross slices
    # (Omega's 8-token window needs slices of 7 tokens: 30 / 5 = 6 is too short)
    _check(3)
    _check(5, skip=("omeganet",))
