"""The strategy contract (docs/math.md, "The strategy contract"): a strategy never changes the
function. Any split of a sequence into calls equals one call, for every strategy and chunk size it
accepts, on outputs, final state (anchor entries included) and gradients; a one-token call runs the
sequential step; strategies are resolved once per value and cached on the rule."""

import pytest
import torch

import atlas_core as ac
from atlas_core.errors import StrategyError
from atlas_core.strategies.base import Strategy

from .conftest import make_inputs

RULES = {
    "delta": {"bias": "core:l2", "algorithm": "core:gd", "retention": "core:none", "anchor": 16},
    "titans": {"use": "titans:titans", "anchor": 16},
    "titans_deep": {"use": "titans:titans_deep"},  # anchor 16 by default; the dual chunk form
}
STRATEGIES = {
    "sequential": "core:sequential",
    "chunk1": {"use": "core:chunkwise", "chunk_size": 1},
    "chunk4": {"use": "core:chunkwise", "chunk_size": 4},
    "chunk16": {"use": "core:chunkwise", "chunk_size": 16},
}
# cut points of a 100-token sequence: on and off the chunk and block grids, one-token calls at the
# start, the middle and the end, and three-call splits
SPLITS = [(37,), (16,), (1,), (99,), (5, 50), (16, 48), (1, 2), (63, 81), (30, 31)]
T = 100


def run_split(rule, q, k, v, gates, cuts, strategy):
    bounds = [0, *cuts, q.shape[1]]
    ys, state = [], None
    for lo, hi in zip(bounds, bounds[1:]):
        y, state = rule(q[:, lo:hi], k[:, lo:hi], v[:, lo:hi],
                        gates={n: g[:, lo:hi] for n, g in gates.items()}, state=state,
                        strategy=strategy)
        ys.append(y)
    return torch.cat(ys, dim=1), state


def outputs_and_grads(rule, strategy, cuts, seed=0):
    q, k, v, gates = make_inputs(B=2, T=T, H=2, Dk=4, Dv=4, seed=seed)
    gates["theta"] = 0.1 * gates["theta"]  # inner steps the deep memory stays finite under
    for t in (q, k, v, *gates.values()):
        t.requires_grad_(True)
    g = {n: gates[n] for n in rule.gate_names}
    y, s = run_split(rule, q, k, v, g, cuts, strategy)
    w = torch.linspace(-1, 1, y.numel(), dtype=y.dtype).reshape(y.shape)  # a fixed cotangent
    loss = (y * w).sum() + sum(t.square().sum() for n, t in s.items() if t.dtype.is_floating_point
                               and n != "anchor.pos")
    grads = torch.autograd.grad(loss, [q, k, v, *g.values()])
    return y.detach(), {n: t.detach() for n, t in s.items()}, grads


@pytest.fixture(scope="module")
def references():
    """One call of core:sequential per rule: the function every run below must equal."""
    out = {}
    for name, spec in RULES.items():
        torch.manual_seed(0)  # the deep memory's learned initial weights
        rule = ac.build_rule(spec, heads=2, d_key=4, d_value=4).double()
        out[name] = (rule, outputs_and_grads(rule, "core:sequential", ()))
    return out


@pytest.mark.parametrize("strategy", list(STRATEGIES))
@pytest.mark.parametrize("rule_name", list(RULES))
def test_any_split_into_calls_equals_one_sequential_call(references, rule_name, strategy):
    rule, (y_ref, s_ref, g_ref) = references[rule_name]
    assert rule.anchor == 16 and any(n.startswith("anchor.") and n != "anchor.pos" for n in s_ref)
    assert torch.equal(s_ref["anchor.pos"], torch.full((2,), float(T % 16), dtype=torch.float64))
    splits = SPLITS if rule_name != "titans_deep" else [(37,), (1, 2), (63, 81)]  # slower
    for cuts in [(), *splits]:
        y, s, grads = outputs_and_grads(rule, STRATEGIES[strategy], cuts)
        assert torch.isfinite(y).all() and all(torch.isfinite(g).all() for g in grads)
        torch.testing.assert_close(y, y_ref, atol=1e-10, rtol=0, msg=f"y, cuts {cuts}")
        assert set(s) == set(s_ref), cuts
        for n in s_ref:
            torch.testing.assert_close(s[n], s_ref[n], atol=1e-10, rtol=0,
                                       msg=f"state[{n!r}], cuts {cuts}")
        for i, (a, b) in enumerate(zip(grads, g_ref)):
            torch.testing.assert_close(a, b, atol=1e-10, rtol=0, msg=f"grad {i}, cuts {cuts}")


def test_the_anchor_is_part_of_the_function(references):
    """The same rule at anchor 1 computes another function (so the checks above can fail)."""
    for name in RULES:
        rule, (y_ref, _, _) = references[name]
        per_token = ac.build_rule({**RULES[name], "anchor": 1}, heads=2, d_key=4, d_value=4).double()
        per_token.load_state_dict(rule.state_dict())
        y1, _, _ = outputs_and_grads(per_token, "core:sequential", ())
        assert (y1 - y_ref).abs().max() > 1e-6, name


class Refusing(Strategy):
    """A strategy that accepts every rule but must never run: it records the calls it got."""

    name = "test:refusing"

    def __init__(self):
        self.calls = 0
        self.checks = 0

    def supports(self, rule):
        self.checks += 1
        return True, ""

    def run(self, rule, inputs):
        self.calls += 1
        raise AssertionError("a one-token call ran the strategy")


def test_a_one_token_call_runs_the_sequential_step():
    rule = ac.build_rule({"use": "titans:titans", "anchor": 4})
    q, k, v, gates = make_inputs(T=1)
    g = {n: gates[n] for n in rule.gate_names}
    strat = Refusing()
    y, s = rule(q, k, v, gates=g, strategy=strat)
    y_seq, s_seq = rule(q, k, v, gates=g, strategy="core:sequential")
    assert strat.calls == 0
    torch.testing.assert_close(y, y_seq, atol=0, rtol=0)
    for n in s_seq:
        torch.testing.assert_close(s[n], s_seq[n], atol=0, rtol=0)
    assert torch.equal(s["anchor.pos"], torch.ones(2, dtype=torch.float64))
    q2, k2, v2, gates2 = make_inputs(T=2)
    with pytest.raises(AssertionError, match="ran the strategy"):
        rule(q2, k2, v2, gates={n: gates2[n] for n in rule.gate_names}, strategy=strat)
    assert strat.calls == 1


def test_strategies_are_resolved_once_per_value_and_cached():
    rule = ac.build_rule({"use": "titans:titans", "anchor": 8})
    q, k, v, gates = make_inputs(T=10)
    g = {n: gates[n] for n in rule.gate_names}
    value = {"use": "core:chunkwise", "chunk_size": 4}
    runner = rule.runner(value)
    assert runner.name == "core:chunkwise" and runner.chunk_size == 4
    assert rule.runner({"chunk_size": 4, "use": "core:chunkwise"}) is runner  # same table
    assert rule.runner("core:sequential") is rule.runner("core:sequential")
    assert rule.runner("core:sequential") is not runner
    # a call with that value runs the cached runner, with no further supports() check
    checks = []
    original = type(runner).supports
    runner.supports = lambda r: checks.append(r) or original(runner, r)
    rule(q, k, v, gates=g, strategy=value)
    rule(q, k, v, gates=g, strategy=dict(value))
    assert checks == []
    # a Strategy object is checked once, then reused
    strat = Refusing()
    assert rule.runner(strat) is strat and rule.runner(strat) is strat
    assert strat.checks == 1


def test_a_refusal_is_not_cached_as_a_runner():
    rule = ac.build_rule({"anchor": 6})
    bad = {"use": "core:chunkwise", "chunk_size": 4}
    for _ in range(2):  # refused again, not served from the cache
        with pytest.raises(StrategyError, match="chunk_size=4 does not divide the rule's anchor=6"):
            rule.runner(bad)
    assert rule.runner({"use": "core:chunkwise", "chunk_size": 3}).chunk_size == 3


@pytest.mark.parametrize("preset,anchor", [
    ("titans:titans", 1), ("titans:titans_deep", 16), ("atlas_muon:atlas", 16),
    ("atlas_muon:atlas_linear", 16), ("omega:omeganet", 1), ("omega:omega_titans", 1),
])
def test_preset_default_anchors(preset, anchor):
    rule = ac.build_rule(preset)
    assert rule.anchor == anchor
    assert rule.spec["anchor"] == anchor
    assert ac.build_rule({"use": preset, "anchor": 2}).anchor == 2  # a key like any other


@pytest.mark.parametrize("A,C", [(16, 16), (100, 50), (128, 64), (7, 7), (96, 48)])
def test_default_chunk_is_the_largest_divisor_of_the_anchor_up_to_64(A, C):
    rule = ac.build_rule({"use": "titans:titans", "anchor": A})
    runner = rule.runner("core:chunkwise")
    assert runner.chunk_for(rule) == C
    q, k, v, gates = make_inputs(T=13)
    g = {n: gates[n] for n in rule.gate_names}
    y, s = rule(q, k, v, gates=g, strategy="core:chunkwise")
    y_seq, s_seq = rule(q, k, v, gates=g, strategy="core:sequential")
    torch.testing.assert_close(y, y_seq, atol=1e-10, rtol=0)
    for n in s_seq:
        torch.testing.assert_close(s[n], s_seq[n], atol=1e-10, rtol=0)
