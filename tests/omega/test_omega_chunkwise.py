"""``omega:window`` under ``core:chunkwise``: chunk size 1 equals sequential on the per-token rule;
chunk size C equals ``core:sequential`` on a rule anchored at C or a multiple of C (every gradient of
a block at the memory before it), including windows longer than a chunk; outputs, final state
(anchor entries included) and gradients; any split into calls equals one call; a per-token rule is
refused at C > 1."""

from itertools import product

import pytest
import torch

from atlas_core.errors import StrategyError

from .conftest import assert_same, chunk, gates_for, make_inputs, window_rule


def split(g, lo, hi):
    return {n: x[:, lo:hi] for n, x in g.items()}


ONE = list(product((1, 3, 8), ("gate", "uniform", "decay"), ("core:gd", "core:momentum"),
                   ("after", "before")))


@pytest.mark.parametrize("c,mode,algorithm,read", ONE,
                         ids=[f"c{c}-{m}-{a.split(':')[1]}-{r}" for c, m, a, r in ONE])
def test_chunk_one_equals_sequential(c, mode, algorithm, read):
    q, k, v, gates = make_inputs(T=11, seed=c)
    rule = window_rule(c, mode, algorithm, read, decay=0.8 if mode == "decay" else None)
    g = gates_for(rule, gates)
    assert_same(rule(q, k, v, gates=g, strategy=chunk(1)),
                rule(q, k, v, gates=g, strategy="core:sequential"), atol=1e-12)


ANCH = [(C, c, a, r) for C in (4, 16, 64) for c in (2, 8, 16)
        for a, r in (("core:gd", "after"), ("core:momentum", "before"))]


@pytest.mark.parametrize("C,c,algorithm,read", ANCH,
                         ids=[f"C{C}-c{c}-{a.split(':')[1]}-{r}" for C, c, a, r in ANCH])
def test_chunk_equals_sequential_on_the_anchored_rule(C, c, algorithm, read):
    # T = 37: a ragged last chunk; c > C for (C=4, c=8/16): windows reach across chunks
    q, k, v, gates = make_inputs(T=37, seed=C + c)
    rule = window_rule(c, "gate", algorithm, read, anchor=C)
    g = gates_for(rule, gates)
    out = rule(q, k, v, gates=g, strategy=chunk(C))
    assert_same(out, rule(q, k, v, gates=g, strategy="core:sequential"))
    # the anchor is part of the function: the per-token rule computes something else
    per_token = window_rule(c, "gate", algorithm, read)
    y_seq, _ = per_token(q, k, v, gates=g, strategy="core:sequential")
    assert (out[0] - y_seq).abs().max() > 1e-6


@pytest.mark.parametrize("C,A", [(4, 8), (4, 12), (8, 64)])
def test_chunk_dividing_a_larger_anchor_equals_sequential(C, A):
    q, k, v, gates = make_inputs(T=37, seed=A)
    rule = window_rule(6, "gate", "core:momentum", "after", anchor=A)
    g = gates_for(rule, gates)
    assert_same(rule(q, k, v, gates=g, strategy=chunk(C)),
                rule(q, k, v, gates=g, strategy="core:sequential"))


@pytest.mark.parametrize("C", [2, 4, 16])
def test_per_token_window_rule_is_refused_above_chunk_one(C):
    q, k, v, gates = make_inputs(T=5)
    rule = window_rule(3, "gate", "core:momentum")
    with pytest.raises(StrategyError, match=rf"chunk_size={C} .*anchor = 1.*anchor = {C}"):
        rule(q, k, v, gates=gates_for(rule, gates), strategy=chunk(C))
    anchored = window_rule(3, "gate", "core:momentum", anchor=3 * C + 1)  # C does not divide it
    with pytest.raises(StrategyError, match=rf"does not divide the rule's anchor={3 * C + 1}"):
        anchored(q, k, v, gates=gates_for(anchored, gates), strategy=chunk(C))


@pytest.mark.parametrize("C", [1, 4, 16])
def test_window_longer_than_the_sequence(C):
    q, k, v, gates = make_inputs(T=5, seed=1)
    rule = window_rule(16, "decay", "core:momentum", decay=0.9, anchor=C)
    g = gates_for(rule, gates)
    y, s = rule(q, k, v, gates=g, strategy=chunk(C))
    assert y.shape == (2, 5, 2, 4) and s["window.k"].shape == (2, 2, 15, 3)
    assert torch.all(s["window.gamma"][:, :, :10] == 0)  # 10 slots never filled
    assert_same((y, s), rule(q, k, v, gates=g, strategy="core:sequential"))


@pytest.mark.parametrize("read", ["after", "before"])
def test_chunkwise_gradients_match_sequential_on_the_anchored_rule(read):
    c, C = 6, 4
    rule = window_rule(c, "gate", "core:momentum", read, anchor=C,
                       feature_map={"use": "omega:poly", "degree": 2, "coefficients": "learned"})
    torch.manual_seed(0)
    w = torch.randn(11, 2, 4, dtype=torch.float64)  # a random cotangent for y

    def grads(strategy):
        q, k, v, gates = make_inputs(T=11, seed=4, requires_grad=True)
        g = gates_for(rule, gates)
        y, s = rule(q, k, v, gates=g, strategy=strategy)
        loss = (y * w).sum() + s["M"].pow(2).sum() + s["Z.M"].sum() + s["anchor.M"].sum()
        coef = rule.feature_map.coef
        return torch.autograd.grad(loss, [q, k, v, *g.values(), coef])

    got = grads(chunk(C))
    want = grads("core:sequential")
    names = ["q", "k", "v", *gates_for(rule, make_inputs()[3]), "coef"]
    for name, a, b in zip(names, got, want):
        assert torch.isfinite(a).all()
        torch.testing.assert_close(a, b, atol=1e-10, rtol=0, msg=f"grad {name}")
    assert got[-1].abs().max() > 0  # the learned coefficients receive gradient


@pytest.mark.parametrize("C,split_at,c", [(1, 5, 8), (4, 8, 8), (4, 4, 16), (16, 16, 4),
                                          (4, 6, 8), (4, 1, 16), (16, 5, 4), (16, 22, 6)])
def test_chunkwise_state_carry_window_crossing_the_split(C, split_at, c):
    """Two calls with the carried state equal one call, split on a chunk boundary or not (the
    blocks are aligned to absolute positions); the window reaches back across the split point."""
    T = 23
    q, k, v, gates = make_inputs(T=T, seed=split_at)
    rule = window_rule(c, "gate", "core:momentum", "after", anchor=C)
    g = gates_for(rule, gates)
    whole = rule(q, k, v, gates=g, strategy=chunk(C))
    ya, sa = rule(q[:, :split_at], k[:, :split_at], v[:, :split_at], gates=split(g, 0, split_at),
                  strategy=chunk(C))
    yb, sb = rule(q[:, split_at:], k[:, split_at:], v[:, split_at:], gates=split(g, split_at, T),
                  state=sa, strategy=chunk(C))
    assert_same((torch.cat([ya, yb], dim=1), sb), whole, atol=1e-12)
    assert_same(whole, rule(q, k, v, gates=g, strategy="core:sequential"), atol=1e-10)
    # the carried window mattered: dropping it changes the second call
    fresh = {n: (torch.zeros_like(x) if n.startswith("window.") else x) for n, x in sa.items()}
    yc, _ = rule(q[:, split_at:], k[:, split_at:], v[:, split_at:], gates=split(g, split_at, T),
                 state=fresh, strategy=chunk(C))
    assert (yc - yb).abs().max() > 1e-6


@pytest.mark.parametrize("C", [1, 4])
def test_deep_memory_window_generic_chunk_path(C):
    """titans:mlp memory runs the generic per-chunk path: C = 1 on the per-token rule and C = 4 on
    the rule anchored at 4 both equal sequential, over one call and over a split off the grid."""
    q, k, v, gates = make_inputs(T=9, Dk=4, Dv=4, seed=6)
    rule = window_rule(5, "uniform", "core:momentum", structure={"use": "titans:mlp", "expansion": 2},
                       anchor=C)
    g = gates_for(rule, gates)
    ref = rule(q, k, v, gates=g, strategy="core:sequential")
    assert_same(rule(q, k, v, gates=g, strategy=chunk(C)), ref)
    ya, sa = rule(q[:, :3], k[:, :3], v[:, :3], gates=split(g, 0, 3), strategy=chunk(C))
    yb, sb = rule(q[:, 3:], k[:, 3:], v[:, 3:], gates=split(g, 3, 9), state=sa, strategy=chunk(C))
    assert_same((torch.cat([ya, yb], dim=1), sb), ref)


def test_gradients_reach_the_carried_window_state():
    """The carried (phi(k), v, gamma) and the block's anchor memory are inputs too: their
    gradients under chunkwise equal core:sequential's, and are nonzero (the first tokens' windows
    read them; the call starts at position 3 of a 4-token block)."""
    c, C = 5, 4
    rule = window_rule(c, "gate", "core:gd", anchor=C)
    q, k, v, gates = make_inputs(T=9, seed=8)
    g = gates_for(rule, gates)
    _, carried = rule(q[:, :3], k[:, :3], v[:, :3], gates=split(g, 0, 3))
    assert torch.equal(carried["anchor.pos"], torch.full((2,), 3.0, dtype=torch.float64))
    rest = split(g, 3, 9)
    names = sorted(n for n in carried if n != "anchor.pos")  # the position is an integer count

    def grads(strategy):
        st = {n: x.detach().clone().requires_grad_(n in names) for n, x in carried.items()}
        y, s = rule(q[:, 3:], k[:, 3:], v[:, 3:], gates=rest, state=st, strategy=strategy)
        loss = y.pow(2).sum() + s["M"].sum()
        return torch.autograd.grad(loss, [st[n] for n in names])

    got = grads(chunk(C))
    want = grads("core:sequential")
    assert "anchor.M" in names
    for name, a, b in zip(names, got, want):
        torch.testing.assert_close(a, b, atol=1e-10, rtol=0, msg=f"grad state[{name!r}]")
        assert a.abs().max() > 0, name
