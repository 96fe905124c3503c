"""``atlas_muon:atlas_parallel`` (and ``core:chunkwise`` on Muon rules) against the references: a
strategy never changes the function, so every accepted chunk size (C = 1 on any rule, C dividing
the rule's anchor) equals ``core:sequential`` on the same rule (outputs, final state with the
anchor entries, gradients) and the hand-written anchored loop; any split into calls (one token at
a time included) equals one call; per-token rules are refused at C > 1 with a reason naming the
anchor; gradients with and without per-chunk recomputation; saved memory; dispatch."""

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


# name -> builder(anchor)
RULES = {
    "lin-c1-after": lambda anchor=1: linear_rule(1, "after", anchor=anchor),
    "lin-c8-before": lambda anchor=1: linear_rule(8, "before", anchor=anchor),
    "deep-c1-after": lambda anchor=1: deep_rule(1, "after", anchor=anchor),
    "deep-c8-before": lambda anchor=1: deep_rule(8, "before", anchor=anchor),
}


def per_token_twin(rule):
    """The same rule with anchor = 1 and the same learned parameters (another function)."""
    name = next(n for n, f in RULES.items() if _same_kind(f(), rule))
    twin = RULES[name]()
    twin.load_state_dict(rule.state_dict())
    return twin


def _same_kind(a, b):
    return a.spec == {**b.spec, "anchor": 1}


def inputs_for(rule, T=11, **kw):
    return make_inputs(T=T, gamma="gamma" in rule.gate_names, **kw)


@pytest.mark.parametrize("anchor", [1, 4], ids=lambda a: f"anchor{a}")
@pytest.mark.parametrize("name", list(RULES))
def test_chunk1_equals_sequential(name, anchor):
    rule = RULES[name](anchor)
    q, k, v, gates = inputs_for(rule)
    with torch.no_grad():
        assert_same(rule(q, k, v, gates=gates, strategy=ap(1)),
                    rule(q, k, v, gates=gates, strategy="core:sequential"))


@pytest.mark.parametrize("C, anchor", [(3, 3), (3, 6), (16, 16)], ids=["C3-A3", "C3-A6", "C16-A16"])
@pytest.mark.parametrize("name", list(RULES))
def test_chunk_equals_sequential_on_the_anchored_rule(name, C, anchor):
    """T = 11 is not a multiple of 3; 16 > T; the window of 8 spans several chunks; anchor 6 holds
    two chunks of 3. Outputs, the final state (anchor entries included) and gradients equal
    core:sequential on the same rule; the per-token rule is another function."""
    rule = RULES[name](anchor)
    q, k, v, gates = inputs_for(rule)
    with torch.no_grad():
        got = rule(q, k, v, gates=gates, strategy=ap(C))
        seq = rule(q, k, v, gates=gates, strategy="core:sequential")
        per_token = per_token_twin(rule)(q, k, v, gates=gates, strategy="core:sequential")
    assert {"anchor.pos", *(f"anchor.{w}" for w in rule.structure.weight_shapes())} <= set(got[1])
    assert got[1]["anchor.pos"].tolist() == [float(11 % anchor)] * 2
    assert_same(got, seq)
    assert (got[0] - per_token[0]).abs().max() > 1e-6  # anchoring really changes the result
    g_got, g_seq = _grads(rule, ap(C)), _grads(rule, "core:sequential")
    assert set(g_got) == set(g_seq)
    for n in g_seq:
        assert torch.isfinite(g_got[n]).all() and g_got[n].abs().max() > 0, n
        torch.testing.assert_close(g_got[n], g_seq[n], rtol=1e-9, atol=1e-10, msg=n)


@pytest.mark.parametrize("name", list(RULES))
def test_per_token_rule_is_refused_at_chunks(name):
    """C > 1 on a per-token rule would anchor its gradients (another function): refused, and the
    reason names the anchor; C that does not divide the anchor is refused too."""
    rule = RULES[name]()
    q, k, v, gates = inputs_for(rule)
    for C in (3, 16):
        ok, reason = ac.get_registry().build("strategy", ap(C)).supports(rule)
        assert not ok and "anchor" in reason, reason
        with pytest.raises(StrategyError, match=r"atlas_parallel cannot run this rule: .*anchor"):
            rule(q, k, v, gates=gates, strategy=ap(C))
    ok, reason = ac.get_registry().build("strategy", ap(4)).supports(RULES[name](6))
    assert not ok and "anchor=6" in reason and "chunk_size=4" in reason


def test_default_chunk_is_the_largest_divisor_of_the_anchor():
    strat = ac.get_registry().build("strategy", {"use": "atlas_muon:atlas_parallel"})
    assert strat.chunk_size is None
    assert [strat.chunk_for(linear_rule(anchor=A)) for A in (16, 12, 7, 128, 96)] == [16, 12, 7, 64, 48]
    assert strat.chunk_for(linear_rule()) == 1 and not strat.supports(linear_rule())[0]
    rule = linear_rule(8, "before", anchor=12)
    q, k, v, gates = inputs_for(rule, T=29)
    with torch.no_grad():
        assert_same(rule(q, k, v, gates=gates, strategy={"use": "atlas_muon:atlas_parallel"}),
                    rule(q, k, v, gates=gates, strategy="core:sequential"))


@pytest.mark.parametrize("window", [1, 8], ids=lambda c: f"c{c}")
def test_chunk_equals_hand_written_anchored_loop(window):
    rule = linear_rule(window, anchor=4)
    q, k, v, gates = make_inputs(gamma=window > 1)
    y, state = rule(q, k, v, gates=gates, strategy=ap(4))
    y_ref, ref = muon_linear_loop(q, k, v, gates, window=window, anchor_every=4, gamma=gates.get("gamma"))
    torch.testing.assert_close(y, y_ref, rtol=0, atol=1e-10)
    for key in ref:
        torch.testing.assert_close(state[key], ref[key], rtol=0, atol=1e-10)
    # the block of tokens 8..10 is open: its anchor memory is M after 8 tokens
    _, head = muon_linear_loop(q[:, :8], k[:, :8], v[:, :8], {n: g[:, :8] for n, g in gates.items()},
                               window=window, anchor_every=4,
                               gamma=gates["gamma"][:, :8] if "gamma" in gates else None)
    assert state["anchor.pos"].tolist() == [3.0, 3.0]
    torch.testing.assert_close(state["anchor.M"], head["M"], rtol=0, atol=1e-10)


@pytest.mark.parametrize("name", list(RULES))
def test_core_chunkwise_runs_muon_with_the_same_results(name):
    rule = RULES[name](8)
    q, k, v, gates = inputs_for(rule)
    with torch.no_grad():
        par = rule(q, k, v, gates=gates, strategy=ap(4))
        assert_same(rule(q, k, v, gates=gates, strategy={"use": "core:chunkwise", "chunk_size": 4}), par)
        assert_same(par, rule(q, k, v, gates=gates, strategy="core:sequential"))


def _in_calls(rule, strategy, pieces, T=11):
    """One call per piece, each given the state the previous one returned."""
    q, k, v, gates = inputs_for(rule, T=T)
    ys, state, i = [], None, 0
    for n in pieces:
        sl = slice(i, i + n)
        y, state = rule(q[:, sl], k[:, sl], v[:, sl], gates={g: x[:, sl] for g, x in gates.items()},
                        state=state, strategy=strategy)
        ys.append(y)
        i += n
    assert i == T
    return torch.cat(ys, 1), state


@pytest.mark.parametrize("C, anchor, split", [(4, 8, 8), (4, 4, 5), (1, 1, 5), (1, 3, 5), (3, 6, 7), (3, 3, 6)],
                         ids=["C4-A8-on-chunk", "C4-A4-inside", "C1", "C1-A3", "C3-A6-inside", "C3-A3-on-block"])
@pytest.mark.parametrize("name", ["lin-c8-before", "deep-c8-before", "lin-c1-after"])
def test_state_carries_across_calls(name, C, anchor, split):
    """M, Z, the Omega window buffer and the anchor block (position and memory) carry: two calls
    equal one call, wherever the split falls, and equal core:sequential."""
    rule = RULES[name](anchor)
    with torch.no_grad():
        one = _in_calls(rule, ap(C), [11])
        two = _in_calls(rule, ap(C), [split, 11 - split])
        seq = _in_calls(rule, "core:sequential", [11])
    assert any(key.startswith("Z.") for key in two[1])
    assert ("anchor.pos" in two[1]) == (anchor > 1)
    assert_same(two, one)
    assert_same(one, seq)


@pytest.mark.parametrize("C, anchor", [(4, 4), (2, 6), (1, 1)], ids=["C4-A4", "C2-A6", "C1-A1"])
@pytest.mark.parametrize("name", ["lin-c8-before", "deep-c1-after"])
def test_decoding_one_token_at_a_time_equals_one_call(name, C, anchor):
    """Decoding: a prompt of 3 tokens, then one token per call (each runs the sequential step),
    equals one chunked call and core:sequential."""
    rule = RULES[name](anchor)
    with torch.no_grad():
        one = _in_calls(rule, ap(C), [11])
        steps = _in_calls(rule, ap(C), [3] + [1] * 8)
        uneven = _in_calls(rule, ap(C), [1, 5, 2, 3])
        seq = _in_calls(rule, "core:sequential", [11])
    assert_same(steps, one)
    assert_same(uneven, one)
    assert_same(one, seq)


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
    rule = RULES[name](8)
    ref = _grads(rule, "core:sequential")
    for strategy in ({"use": "core:chunkwise", "chunk_size": 4}, ap(4), ap(4, checkpoint=False)):
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
    rule = linear_rule(2, anchor=2)
    q, k, v, gates = make_inputs(B=1, T=5, H=1, Dk=2, Dv=3, gamma=True, requires_grad=True)
    names = list(gates)

    def f(q, k, v, *g):
        y, s = rule(q, k, v, gates=dict(zip(names, g)), strategy=ap(2))
        return y, s["M"], s["Z.M"], s["anchor.M"]

    assert torch.autograd.gradcheck(f, (q, k, v, *gates.values()), fast_mode=True)


def _saved_bytes_per_token(strategy, T1=16, T2=32, d=8):
    """Growth with T of the bytes autograd keeps for the backward pass (linear memory)."""

    def saved(T):
        rule = ac.build_rule({"retention": "core:decay", "algorithm": "atlas_muon:muon", "anchor": 8})
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
    with it, per token only O(d + d^2 / C) floats stay saved: the boundary state (memory and
    momentum, 2 d^2) once per chunk, never a view that keeps a chunk's per-token tensor alive."""
    d = 16
    d2 = d * d * 4  # bytes of one d x d float32 matrix
    plain = _saved_bytes_per_token({"use": "core:chunkwise", "chunk_size": 8, "checkpoint": False}, d=d)
    assert plain >= 5 * d2
    for strategy in (ap(8), {"use": "core:chunkwise", "chunk_size": 8}):
        kept = _saved_bytes_per_token(strategy, d=d)
        # per token: 2 d^2 / C of boundary state, O(C) of the chunk's decay matrices, O(d) inputs
        assert kept < d2, strategy


def test_dispatch_and_refusals():
    muon = linear_rule(anchor=16)
    assert resolve_strategy(muon, "auto").name == "atlas_muon:atlas_parallel"
    # the per-token Muon rule has no exact chunked form: auto runs it sequentially
    assert resolve_strategy(linear_rule(), "auto").name == "core:sequential"
    momentum = ac.build_rule({"retention": "core:decay", "algorithm": "core:momentum", "anchor": 4})
    assert resolve_strategy(momentum, "auto").name != "atlas_muon:atlas_parallel"
    strat = ac.get_registry().build("strategy", ap(4))
    ok, reason = strat.supports(momentum)
    assert not ok and "atlas_muon:muon" in reason and "core:momentum" in reason
    q, k, v, gates = make_inputs()
    with pytest.raises(StrategyError, match=r"atlas_parallel cannot run this rule: .*core:chunkwise"):
        momentum(q, k, v, gates=gates, strategy=ap(4))
    assert "chunk_size=4" in strat.describe()


def test_no_grad_and_grad_paths_agree():
    rule = deep_rule(8, "after", anchor=4)
    q, k, v, gates = inputs_for(rule)
    with torch.no_grad():
        y0, s0 = rule(q, k, v, gates=gates, strategy=ap(4))
    y1, s1 = rule(q, k, v, gates=gates, strategy=ap(4))
    assert y1.requires_grad  # the learned initial memory is a parameter
    assert_same((y0, s0), (y1.detach(), {n: s.detach() for n, s in s1.items()}))
