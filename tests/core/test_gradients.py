"""Gradients reach every input; float64 gradcheck on tiny sizes for both strategies (chunkwise on
rules whose anchor its chunk size divides, or at any chunk for the memory-free dot bias)."""

import pytest
import torch

import atlas_core as ac

from .conftest import make_inputs

CHUNK2 = {"use": "core:chunkwise", "chunk_size": 2}
STRATEGIES = [("core:sequential", 1), ("core:sequential", 2), (CHUNK2, 2)]
IDS = ["sequential", "sequential-anchor2", "chunkwise-C2-anchor2"]


def _rule(**kw):
    spec = {"retention": "core:decay", "algorithm": "core:momentum", **kw}
    return ac.build_rule(spec)


@pytest.mark.parametrize("strategy,anchor", STRATEGIES, ids=IDS)
@pytest.mark.parametrize("read", ["after", "before"])
def test_gradients_reach_every_input(strategy, anchor, read):
    q, k, v, gates = make_inputs(T=7, requires_grad=True)
    rule = _rule(read=read, anchor=anchor).bind(3, 4, 5)
    M0 = torch.randn(2, 3, 5, 4, dtype=torch.float64, requires_grad=True)
    Z0 = torch.randn(2, 3, 5, 4, dtype=torch.float64, requires_grad=True)
    state = {**rule.init_state(2, dtype=torch.float64), "M": M0, "Z.M": Z0}
    y, s = rule(q, k, v, gates=gates, state=state, strategy=strategy)
    (y.square().sum() + s["M"].sum() + s["Z.M"].sum()).backward()
    for name, t in [("q", q), ("k", k), ("v", v), ("M0", M0), ("Z0", Z0), *gates.items()]:
        assert t.grad is not None, name
        assert torch.isfinite(t.grad).all(), name
        assert t.grad.abs().sum() > 0, f"no gradient reached {name}"


@pytest.mark.parametrize("anchor,C", [(1, 1), (2, 1), (2, 2), (6, 3)])
def test_gradients_match_sequential(anchor, C):
    q, k, v, gates = make_inputs(T=7, requires_grad=True)
    rule = _rule(anchor=anchor)
    inputs = (q, k, v, *gates.values())

    def run(strat):
        y, s = rule(q, k, v, gates=gates, strategy=strat)
        return torch.autograd.grad((y.sin().sum() + s["M"].square().sum()), inputs)

    ref = run("core:sequential")
    got = run({"use": "core:chunkwise", "chunk_size": C})
    for a, b in zip(got, ref):
        torch.testing.assert_close(a, b, atol=1e-10, rtol=0)


GRADCHECK = [("core:l2", "core:momentum", "core:sequential", 1),
             ("core:l2", "core:momentum", "core:sequential", 2),
             ("core:l2", "core:momentum", CHUNK2, 2),
             ("core:dot", "core:gd", "core:sequential", 1),
             ("core:dot", "core:gd", CHUNK2, 1),  # prediction-free: any chunk at anchor 1
             ("core:dot", "core:gd", CHUNK2, 2)]


@pytest.mark.parametrize("bias,alg,strategy,anchor", GRADCHECK,
                         ids=["l2-sequential", "l2-sequential-anchor2", "l2-chunkwise-C2-anchor2",
                              "dot-sequential", "dot-chunkwise-C2", "dot-chunkwise-C2-anchor2"])
def test_gradcheck(bias, alg, strategy, anchor):
    q, k, v, gates = make_inputs(B=1, T=4, H=1, Dk=2, Dv=2, requires_grad=True)
    rule = ac.build_rule({"bias": bias, "algorithm": alg, "retention": "core:decay", "read": "before",
                          "anchor": anchor}, heads=1, d_key=2, d_value=2)
    names = rule.gate_names
    M0 = torch.randn(1, 1, 2, 2, dtype=torch.float64, requires_grad=True)

    def f(q, k, v, M0, *g):
        state = rule.init_state(1, dtype=torch.float64)
        state["M"] = M0
        y, s = rule(q, k, v, gates=dict(zip(names, g)), state=state, strategy=strategy)
        return y, s["M"]

    assert torch.autograd.gradcheck(f, (q, k, v, M0, *[gates[n] for n in names]))
