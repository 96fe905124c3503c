"""Gradients reach every input; float64 gradcheck on tiny sizes for both strategies."""

import pytest
import torch

import atlas_core as ac

from .conftest import make_inputs

STRATEGIES = ["core:sequential", {"use": "core:chunkwise", "chunk_size": 2}]
IDS = ["sequential", "chunkwise-C2"]


def _rule(**kw):
    spec = {"retention": "core:decay", "algorithm": "core:momentum", **kw}
    return ac.build_rule(spec)


@pytest.mark.parametrize("strategy", STRATEGIES, ids=IDS)
@pytest.mark.parametrize("read", ["after", "before"])
def test_gradients_reach_every_input(strategy, read):
    q, k, v, gates = make_inputs(T=7, requires_grad=True)
    rule = _rule(read=read)
    M0 = torch.randn(2, 3, 5, 4, dtype=torch.float64, requires_grad=True)
    Z0 = torch.randn(2, 3, 5, 4, dtype=torch.float64, requires_grad=True)
    y, s = rule(q, k, v, gates=gates, state={"M": M0, "Z.M": Z0}, strategy=strategy)
    (y.square().sum() + s["M"].sum() + s["Z.M"].sum()).backward()
    for name, t in [("q", q), ("k", k), ("v", v), ("M0", M0), ("Z0", Z0), *gates.items()]:
        assert t.grad is not None, name
        assert torch.isfinite(t.grad).all(), name
        assert t.grad.abs().sum() > 0, f"no gradient reached {name}"


@pytest.mark.parametrize("strategy", STRATEGIES, ids=IDS)
def test_gradients_match_between_strategies_at_chunk_1(strategy):
    q, k, v, gates = make_inputs(T=6, requires_grad=True)
    rule = _rule()
    inputs = (q, k, v, *gates.values())

    def run(strat):
        y, s = rule(q, k, v, gates=gates, strategy=strat)
        return torch.autograd.grad((y.sin().sum() + s["M"].square().sum()), inputs)

    ref = run("core:sequential")
    got = run({"use": "core:chunkwise", "chunk_size": 1})
    for a, b in zip(got, ref):
        torch.testing.assert_close(a, b, atol=1e-10, rtol=0)


@pytest.mark.parametrize("strategy", STRATEGIES, ids=IDS)
@pytest.mark.parametrize("bias,alg", [("core:l2", "core:momentum"), ("core:dot", "core:gd")])
def test_gradcheck(strategy, bias, alg):
    q, k, v, gates = make_inputs(B=1, T=4, H=1, Dk=2, Dv=2, requires_grad=True)
    rule = ac.build_rule({"bias": bias, "algorithm": alg, "retention": "core:decay", "read": "before"},
                         heads=1, d_key=2, d_value=2)
    names = rule.gate_names
    M0 = torch.randn(1, 1, 2, 2, dtype=torch.float64, requires_grad=True)

    def f(q, k, v, M0, *g):
        state = rule.init_state(1, dtype=torch.float64)
        state["M"] = M0
        y, s = rule(q, k, v, gates=dict(zip(names, g)), state=state, strategy=strategy)
        return y, s["M"]

    assert torch.autograd.gradcheck(f, (q, k, v, M0, *[gates[n] for n in names]))
