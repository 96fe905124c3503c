"""``atlas_muon:atlas_parallel`` (and ``core:chunkwise`` on Muon rules) against the references:
chunk size 1 equals ``core:sequential``; chunk size C equals the anchored loop; state carry;
gradients (with and without per-chunk recomputation); saved memory; dispatch."""

from __future__ import annotations

import pytest
import torch

import atlas_core as ac
from atlas_core.errors import StrategyError
from atlas_core.strategies.base import resolve_strategy

from .conftest import DT, make_inputs
from .loops import muon_linear_loop
from .test_muon_rule import deep_rule, linear_rule


def ap(C, **kw):
    return {"use": "atlas_muon:atlas_parallel", "chunk_size": C, **kw}


def assert_same(a, b, atol=1e-10):
    ya, sa = a
    yb, sb = b
    torch.testing.assert_close(ya, yb, rtol=0, atol=atol)
    assert set(sa) == set(sb)
    for key in sa:
        torch.testing.assert_close(sa[key], sb[key], rtol=0, atol=atol)


RULES = {
    "lin-c1-after": lambda: linear_rule(1, "after"),
    "lin-c8-before": lambda: linear_rule(8, "before"),
    "deep-c1-after": lambda: deep_rule(1, "after"),
    "deep-c8-before": lambda: deep_rule(8, "before"),
}


def inputs_for(rule, T=11, **kw):
    return make_inputs(T=T, gamma="gamma" in rule.gate_names, **kw)


@pytest.mark.parametrize("name", list(RULES))
def test_chunk1_equals_sequential(name):
    rule = RULES[name]()
    q, k, v, gates = inputs_for(rule)
    with torch.no_grad():
        assert_same(rule(q, k, v, gates=gates, strategy=ap(1)),
                    rule(q, k, v, gates=gates, strategy="core:sequential"))


@pytest.mark.parametrize("C", [3, 16])
@pytest.mark.parametrize("name", list(RULES))
def test_chunk_equals_anchored_reference(name, C):
    """T = 11 is not a multiple of 3; 16 > T; the window of 8 spans several chunks."""
    rule = RULES[name]()
    q, k, v, gates = inputs_for(rule)
    with torch.no_grad():
        got = rule(q, k, v, gates=gates, strategy=ap(C))
        inputs = rule.prepare(q, k, v, gates=gates)
        ref = rule.finish(inputs, rule.reference(inputs, anchor_every=C))
        seq = rule(q, k, v, gates=gates, strategy="core:sequential")
    assert_same(got, ref)
    assert (got[0] - seq[0]).abs().max() > 1e-6  # anchoring really changes the result


@pytest.mark.parametrize("window", [1, 8], ids=lambda c: f"c{c}")
def test_chunk_equals_hand_written_anchored_loop(window):
    rule = linear_rule(window)
    q, k, v, gates = make_inputs(gamma=window > 1)
    y, state = rule(q, k, v, gates=gates, strategy=ap(4))
    y_ref, ref = muon_linear_loop(q, k, v, gates, window=window, anchor_every=4, gamma=gates.get("gamma"))
    torch.testing.assert_close(y, y_ref, rtol=0, atol=1e-10)
    for key in ref:
        torch.testing.assert_close(state[key], ref[key], rtol=0, atol=1e-10)


@pytest.mark.parametrize("name", list(RULES))
def test_core_chunkwise_runs_muon_with_the_same_results(name):
    rule = RULES[name]()
    q, k, v, gates = inputs_for(rule)
    with torch.no_grad():
        assert_same(rule(q, k, v, gates=gates, strategy={"use": "core:chunkwise", "chunk_size": 4}),
                    rule(q, k, v, gates=gates, strategy=ap(4)))


@pytest.mark.parametrize("C, split", [(4, 8), (1, 5), (3, 6)], ids=["C4-on-boundary", "C1", "C3-on-boundary"])
@pytest.mark.parametrize("name", ["lin-c8-before", "deep-c8-before", "lin-c1-after"])
def test_state_carries_across_calls(name, C, split):
    """M, Z and the Omega window buffer carry: two calls equal one call (split on a boundary)."""
    rule = RULES[name]()
    q, k, v, gates = inputs_for(rule)
    with torch.no_grad():
        y_all, s_all = rule(q, k, v, gates=gates, strategy=ap(C))
        first = {n: g[:, :split] for n, g in gates.items()}
        second = {n: g[:, split:] for n, g in gates.items()}
        y1, s1 = rule(q[:, :split], k[:, :split], v[:, :split], gates=first, strategy=ap(C))
        y2, s2 = rule(q[:, split:], k[:, split:], v[:, split:], gates=second, state=s1, strategy=ap(C))
    assert any(key.startswith("Z.") for key in s1)
    assert_same((torch.cat([y1, y2], 1), s2), (y_all, s_all))


def _grads(rule, strategy, T=9):
    q, k, v, gates = inputs_for(rule, T=T, requires_grad=True)
    for p in rule.parameters():
        p.grad = None
    y, state = rule(q, k, v, gates=gates, strategy=strategy)
    (y.square().sum() + sum(s.square().sum() for s in state.values())).backward()
    named = {"q": q, "k": k, "v": v, **gates}
    out = {n: x.grad.clone() for n, x in named.items()}
    out.update({f"param.{n}": p.grad.clone() for n, p in rule.named_parameters()})
    return out


@pytest.mark.parametrize("name", ["lin-c8-before", "deep-c8-before"])
def test_gradients_equal_with_and_without_recomputation(name):
    rule = RULES[name]()
    ref = _grads(rule, {"use": "core:chunkwise", "chunk_size": 4})
    for strategy in (ap(4), ap(4, checkpoint=False)):
        got = _grads(rule, strategy)
        assert set(got) == set(ref)
        for n in ref:
            assert torch.isfinite(got[n]).all() and got[n].abs().max() > 0, n
            torch.testing.assert_close(got[n], ref[n], rtol=1e-9, atol=1e-10, msg=n)
    if "deep" in name:  # gradients reach the learned initial memory through the recomputation
        assert {"param.structure.init.W1", "param.structure.init.W2"} <= set(ref)


def test_chunk1_gradients_equal_sequential():
    rule = linear_rule(8, "before")
    got, ref = _grads(rule, ap(1)), _grads(rule, "core:sequential")
    for n in ref:
        torch.testing.assert_close(got[n], ref[n], rtol=0, atol=1e-10, msg=n)


def test_gradcheck_tiny():
    rule = linear_rule(2)
    q, k, v, gates = make_inputs(B=1, T=5, H=1, Dk=2, Dv=3, gamma=True, requires_grad=True)
    names = list(gates)

    def f(q, k, v, *g):
        y, s = rule(q, k, v, gates=dict(zip(names, g)), strategy=ap(2))
        return y, s["M"], s["Z.M"]

    assert torch.autograd.gradcheck(f, (q, k, v, *gates.values()), fast_mode=True)


def _saved_bytes_per_token(strategy, T1=16, T2=32, d=8):
    """Growth with T of the bytes autograd keeps for the backward pass (linear memory)."""

    def saved(T):
        rule = ac.build_rule({"retention": "core:decay", "algorithm": "atlas_muon:muon"})
        q, k, v, gates = make_inputs(B=1, T=T, H=1, Dk=d, Dv=d, dtype=torch.float32, requires_grad=True)
        seen, total = set(), [0]

        def pack(x):
            ptr = x.untyped_storage().data_ptr()
            if ptr not in seen:
                seen.add(ptr)
                total[0] += x.untyped_storage().nbytes()
            return x

        with torch.autograd.graph.saved_tensors_hooks(pack, lambda x: x):
            y, _ = rule(q, k, v, gates=gates, strategy=strategy)
        y.sum().backward()
        return total[0]

    return (saved(T2) - saved(T1)) / (T2 - T1)


def test_recomputation_keeps_only_chunk_boundaries():
    """Without recomputation every token keeps its momentum and NS iterates (>= k d^2 floats);
    with it, per token only O(d + d^2 / C) floats stay saved."""
    d2 = 8 * 8 * 4  # bytes of one d x d float32 matrix
    plain = _saved_bytes_per_token({"use": "core:chunkwise", "chunk_size": 8})
    kept = _saved_bytes_per_token(ap(8))
    assert plain >= 5 * d2
    assert kept < plain / 5


def test_dispatch_and_refusals():
    muon = linear_rule()
    assert resolve_strategy(muon, "auto").name == "atlas_muon:atlas_parallel"
    momentum = ac.build_rule({"retention": "core:decay", "algorithm": "core:momentum"})
    assert resolve_strategy(momentum, "auto").name != "atlas_muon:atlas_parallel"
    strat = ac.get_registry().build("strategy", ap(4))
    ok, reason = strat.supports(momentum)
    assert not ok and "atlas_muon:muon" in reason and "core:momentum" in reason
    q, k, v, gates = make_inputs()
    with pytest.raises(StrategyError, match=r"atlas_parallel cannot run this rule: .*core:chunkwise"):
        momentum(q, k, v, gates=gates, strategy=ap(4))
    assert "chunk_size=4" in strat.describe()


def test_no_grad_and_grad_paths_agree():
    rule = deep_rule(8, "after")
    q, k, v, gates = inputs_for(rule)
    with torch.no_grad():
        y0, s0 = rule(q, k, v, gates=gates, strategy=ap(4))
    y1, s1 = rule(q, k, v, gates=gates, strategy=ap(4))
    assert y1.requires_grad  # the learned initial memory is a parameter
    assert_same((y0, s0), (y1.detach(), {n: s.detach() for n, s in s1.items()}))
