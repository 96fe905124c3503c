"""``omega:window`` under ``core:chunkwise``: chunk size 1 equals sequential; chunk size C equals
the anchored reference loop (every gradient of a chunk at the memory before it), including
windows longer than a chunk; outputs, final state and gradients; state carry across calls."""

from itertools import product

import pytest
import torch

from .conftest import anchored, gates_for, make_inputs, window_rule


def chunk(C):
    return {"use": "core:chunkwise", "chunk_size": C}


def assert_same(a, b, atol=1e-10):
    (ya, sa), (yb, sb) = a, b
    torch.testing.assert_close(ya, yb, atol=atol, rtol=0)
    assert set(sa) == set(sb)
    for name in sa:
        torch.testing.assert_close(sa[name], sb[name], atol=atol, rtol=0, msg=f"state[{name!r}]")


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
def test_chunk_equals_anchored_reference(C, c, algorithm, read):
    # T = 37: a ragged last chunk; c > C for (C=4, c=8/16): windows reach across chunks
    q, k, v, gates = make_inputs(T=37, seed=C + c)
    rule = window_rule(c, "gate", algorithm, read)
    g = gates_for(rule, gates)
    out = rule(q, k, v, gates=g, strategy=chunk(C))
    assert_same(out, anchored(rule, q, k, v, g, every=C))
    # the anchoring is a real approximation: it differs from the sequential rule for C > 1
    y_seq, _ = rule(q, k, v, gates=g, strategy="core:sequential")
    assert (out[0] - y_seq).abs().max() > 1e-6


@pytest.mark.parametrize("C", [1, 4, 16])
def test_window_longer_than_the_sequence(C):
    q, k, v, gates = make_inputs(T=5, seed=1)
    rule = window_rule(16, "decay", "core:momentum", decay=0.9)
    g = gates_for(rule, gates)
    y, s = rule(q, k, v, gates=g, strategy=chunk(C))
    assert y.shape == (2, 5, 2, 4) and s["window.k"].shape == (2, 2, 15, 3)
    assert torch.all(s["window.gamma"][:, :, :10] == 0)  # 10 slots never filled
    assert_same((y, s), anchored(rule, q, k, v, g, every=C))


@pytest.mark.parametrize("read", ["after", "before"])
def test_chunkwise_gradients_match_anchored_reference(read):
    c, C = 6, 4
    rule = window_rule(c, "gate", "core:momentum", read,
                       feature_map={"use": "omega:poly", "degree": 2, "coefficients": "learned"})
    torch.manual_seed(0)
    w = torch.randn(11, 2, 4, dtype=torch.float64)  # a random cotangent for y

    def grads(fn):
        q, k, v, gates = make_inputs(T=11, seed=4, requires_grad=True)
        g = gates_for(rule, gates)
        y, s = fn(q, k, v, g)
        loss = (y * w).sum() + s["M"].pow(2).sum() + s["Z.M"].sum()
        coef = rule.feature_map.coef
        return torch.autograd.grad(loss, [q, k, v, *g.values(), coef])

    got = grads(lambda q, k, v, g: rule(q, k, v, gates=g, strategy=chunk(C)))
    want = grads(lambda q, k, v, g: anchored(rule, q, k, v, g, every=C))
    names = ["q", "k", "v", *gates_for(rule, make_inputs()[3]), "coef"]
    for name, a, b in zip(names, got, want):
        assert torch.isfinite(a).all()
        torch.testing.assert_close(a, b, atol=1e-10, rtol=0, msg=f"grad {name}")
    assert got[-1].abs().max() > 0  # the learned coefficients receive gradient


@pytest.mark.parametrize("C,split,c", [(1, 5, 8), (4, 8, 8), (4, 4, 16), (16, 16, 4)])
def test_chunkwise_state_carry_window_crossing_the_split(C, split, c):
    """Two calls with the carried state equal one call (split on a chunk boundary, as the chunk
    grid restarts at each call); the window reaches back across the split point."""
    T = 23
    q, k, v, gates = make_inputs(T=T, seed=split)
    rule = window_rule(c, "gate", "core:momentum", "after")
    g = gates_for(rule, gates)
    whole = rule(q, k, v, gates=g, strategy=chunk(C))
    ya, sa = rule(q[:, :split], k[:, :split], v[:, :split],
                  gates={n: x[:, :split] for n, x in g.items()}, strategy=chunk(C))
    yb, sb = rule(q[:, split:], k[:, split:], v[:, split:],
                  gates={n: x[:, split:] for n, x in g.items()}, state=sa, strategy=chunk(C))
    assert_same((torch.cat([ya, yb], dim=1), sb), whole, atol=1e-12)
    # the carried window mattered: dropping it changes the second call
    fresh = {n: (torch.zeros_like(x) if n.startswith("window.") else x) for n, x in sa.items()}
    yc, _ = rule(q[:, split:], k[:, split:], v[:, split:],
                 gates={n: x[:, split:] for n, x in g.items()}, state=fresh, strategy=chunk(C))
    assert (yc - yb).abs().max() > 1e-6


@pytest.mark.parametrize("C", [1, 4])
def test_deep_memory_window_generic_chunk_path(C):
    """titans:mlp memory runs the generic per-chunk path: C = 1 equals sequential, C = 4 the
    anchored reference."""
    q, k, v, gates = make_inputs(T=9, Dk=4, Dv=4, seed=6)
    rule = window_rule(5, "uniform", "core:momentum", structure={"use": "titans:mlp", "expansion": 2})
    g = gates_for(rule, gates)
    ref = (rule(q, k, v, gates=g, strategy="core:sequential") if C == 1
           else anchored(rule, q, k, v, g, every=C))
    assert_same(rule(q, k, v, gates=g, strategy=chunk(C)), ref)


def test_gradients_reach_the_carried_window_state():
    """The carried (phi(k), v, gamma) are inputs too: their gradients under chunkwise equal the
    anchored reference's, and are nonzero (the first tokens' windows read them)."""
    c, C = 5, 4
    rule = window_rule(c, "gate", "core:gd")
    q, k, v, gates = make_inputs(T=9, seed=8)
    g = gates_for(rule, gates)
    _, carried = rule(q[:, :3], k[:, :3], v[:, :3], gates={n: x[:, :3] for n, x in g.items()})
    rest = {n: x[:, 3:] for n, x in g.items()}

    def grads(fn):
        st = {n: x.detach().clone().requires_grad_(True) for n, x in carried.items()}
        y, s = fn(st)
        loss = y.pow(2).sum() + s["M"].sum()
        return torch.autograd.grad(loss, [st[n] for n in sorted(st)])

    got = grads(lambda st: rule(q[:, 3:], k[:, 3:], v[:, 3:], gates=rest, state=st,
                                strategy=chunk(C)))
    want = grads(lambda st: anchored(rule, q[:, 3:], k[:, 3:], v[:, 3:], rest, state=st, every=C))
    for name, a, b in zip(sorted(carried), got, want):
        torch.testing.assert_close(a, b, atol=1e-10, rtol=0, msg=f"grad state[{name!r}]")
        assert a.abs().max() > 0, name
