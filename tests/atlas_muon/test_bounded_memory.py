"""Bounded training memory of ``atlas_muon:atlas_parallel`` (atlas_core/forms/recompute.py):
per-chunk recomputation and the coarser segment grid (``memory_budget_mib``) change nothing but
what is kept. Float64: outputs, final state and every gradient equal the same strategy without
recomputation and ``core:sequential``; calls that start inside a chunk or a segment carry exactly;
the kept boundary states number about sqrt(N) with segments."""

from __future__ import annotations

import pytest
import torch

import atlas_core as ac
from atlas_core.forms.recompute import segment_size

from .conftest import make_inputs
from .test_atlas_parallel import RULES, _grads, _in_calls, ap, assert_same

TINY = 1e-9  # a budget no boundary state fits: always segments
MODES = {
    "plain": {"checkpoint": False, "memory_budget_mib": None},
    "per-chunk": {},
    "segments": {"memory_budget_mib": TINY},
    "segments-no-chunk-recompute": {"checkpoint": False, "memory_budget_mib": TINY},
}


def test_segment_size_follows_the_budget():
    mib = 2**20
    assert segment_size(64, mib, 1024) == 1  # 64 MiB of boundary states fit
    assert segment_size(64, mib, 32) == 8  # ceil(sqrt(64))
    assert segment_size(65, mib, 32) == 9
    assert segment_size(10, mib, TINY) == 4
    assert segment_size(3, mib, TINY) == 1  # too few chunks to group
    assert segment_size(10**6, mib, None) == 1  # no budget


@pytest.mark.parametrize("mode", list(MODES)[1:])
@pytest.mark.parametrize("name", ["lin-c8-before", "deep-c8-before", "deep-c1-after"])
def test_outputs_and_gradients_equal_without_the_bound_and_sequential(name, mode):
    rule = RULES[name](4)
    T = 37  # ten chunks of 4 (the last one short): segments of 4, 4 and 2 chunks
    plain, bounded = ap(4, **MODES["plain"]), ap(4, **MODES[mode])
    q, k, v, gates = make_inputs(T=T, gamma="gamma" in rule.gate_names)
    with torch.no_grad():
        ref = rule(q, k, v, gates=gates, strategy=plain)
    got = rule(q, k, v, gates=gates, strategy=bounded)
    assert_same((got[0].detach(), {n: s.detach() for n, s in got[1].items()}), ref, atol=1e-12)
    g_plain, g_bounded = _grads(rule, plain, T=T), _grads(rule, bounded, T=T)
    g_seq = _grads(rule, "core:sequential", T=T)
    assert set(g_bounded) == set(g_plain) == set(g_seq)
    for n in g_plain:
        assert torch.isfinite(g_bounded[n]).all() and g_bounded[n].abs().max() > 0, n
        torch.testing.assert_close(g_bounded[n], g_plain[n], rtol=1e-10, atol=1e-10, msg=n)
        torch.testing.assert_close(g_bounded[n], g_seq[n], rtol=1e-9, atol=1e-10, msg=n)


@pytest.mark.parametrize("name", ["lin-c8-before", "deep-c8-before"])
def test_calls_split_inside_a_segment_equal_one_call(name):
    rule = RULES[name](4)
    seg = ap(2, memory_budget_mib=TINY)
    with torch.no_grad():
        one = _in_calls(rule, ap(2, **MODES["plain"]), [11])
        two = _in_calls(rule, seg, [3, 8])
        seq = _in_calls(rule, "core:sequential", [11])
    assert_same(two, one)
    assert_same(one, seq)


def _saved_state_tensors(strategy, T=512, d=16, C=8):
    """How many d x d tensors (boundary states: memory, momentum) autograd keeps after the forward."""
    rule = ac.build_rule({"retention": "core:decay", "algorithm": "atlas_muon:muon", "anchor": C})
    q, k, v, gates = make_inputs(B=1, T=T, H=1, Dk=d, Dv=d, dtype=torch.float32, requires_grad=True)
    seen = set()

    def pack(x):
        if tuple(x.shape[-2:]) == (d, d):
            seen.add(x.untyped_storage().data_ptr())
        return x

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda x: x):
        y, _ = rule(q, k, v, gates=gates, strategy=strategy)
    y.sum().backward()
    return len(seen)


def test_segments_keep_about_sqrt_n_boundary_states():
    N = 512 // 8
    per_chunk = _saved_state_tensors(ap(8, memory_budget_mib=None))
    segments = _saved_state_tensors(ap(8, memory_budget_mib=TINY))
    assert per_chunk >= 2 * N - 2  # memory and momentum at every chunk boundary
    assert segments <= 2 * (N // 8 + 1)  # ... at every segment boundary only (S = 8)
