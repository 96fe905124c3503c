"""``titans:mlp`` deep memory with every core knob combination (the foundation issue's "the same
holds for titans:mlp"): l2 and dot biases, gd and momentum, decay and none, read after and before.

The oracle is a hand-written loop (explicit weights, the inner gradient by autograd, optional
anchoring every C tokens), independent of the knob objects; float64, tiny sizes."""

from __future__ import annotations

from itertools import product

import pytest
import torch
import torch.nn.functional as F

import atlas_core as ac

DT = torch.float64
COMBOS = list(product(["l2", "dot"], ["gd", "momentum"], ["decay", "none"], ["after", "before"]))
IDS = ["-".join(c) for c in COMBOS]


def make_rule(bias, alg, ret, read, anchor=1):
    torch.manual_seed(0)
    return ac.build_rule({
        "structure": {"use": "titans:mlp", "depth": 2, "expansion": 2.0, "activation": "silu"},
        "bias": f"core:{bias}", "algorithm": f"core:{alg}", "retention": f"core:{ret}", "read": read,
        "anchor": anchor,
    }, heads=2, d_key=3, d_value=3).to(DT)


def make_inputs(B=2, T=11, H=2, D=3, seed=1, theta=0.2):
    g = torch.Generator().manual_seed(seed)
    q, k, v = (torch.randn(B, T, H, D, generator=g, dtype=DT) for _ in range(3))
    gates = {"alpha": 0.8 + 0.2 * torch.rand(B, T, H, generator=g, dtype=DT),
             "eta": 0.9 * torch.rand(B, T, H, generator=g, dtype=DT),
             "theta": theta * torch.rand(B, T, H, generator=g, dtype=DT)}
    return q, k, v, gates


def mlp(Ws, x):
    """x + W2 silu(W1 x): Ws [B, H, out, in], x [B, H, D]."""
    return x + torch.einsum("bhoi,bhi->bho", Ws[1], F.silu(torch.einsum("bhoi,bhi->bho", Ws[0], x)))


def hand_loop(rule, q, k, v, gates, bias, alg, ret, read, anchor_every=1, Ws0=None, Zs0=None):
    """The memory reads with ``W_init + O``; the state is the offset O (``Ws0``, zero by default),
    which the algorithm and retention update. Gradients of a block of ``anchor_every`` tokens are
    taken at the block's start. Returns ``(y, offsets, momenta)``."""
    S = rule.structure
    B = q.shape[0]
    base = [S.init[f"W{i}"].detach().unsqueeze(0).expand(B, -1, -1, -1) for i in (1, 2)]
    Ws = [torch.zeros_like(w) for w in base] if Ws0 is None else [w.clone() for w in Ws0]
    Zs = [torch.zeros_like(w) for w in Ws] if Zs0 is None else [z.clone() for z in Zs0]

    def eff(offsets):
        return [b + o for b, o in zip(base, offsets)]

    ys, anchor = [], Ws
    for t in range(q.shape[1]):
        if t % anchor_every == 0:
            anchor = Ws
        if read == "before":
            ys.append(mlp(eff(Ws), q[:, t]))
        leaf = [w.detach().requires_grad_(True) for w in anchor]
        pred = mlp(eff(leaf), k[:, t])
        loss = 0.5 * (pred - v[:, t]).pow(2).sum() if bias == "l2" else -(pred * v[:, t]).sum()
        grads = torch.autograd.grad(loss, leaf)
        a = gates["alpha"][:, t, :, None, None] if ret == "decay" else 1.0
        th = gates["theta"][:, t, :, None, None]
        if alg == "gd":
            Ws = [a * w - th * g for w, g in zip(Ws, grads)]
        else:
            Zs = [gates["eta"][:, t, :, None, None] * z + th * g for z, g in zip(Zs, grads)]
            Ws = [a * w - z for w, z in zip(Ws, Zs)]
        if read == "after":
            ys.append(mlp(eff(Ws), q[:, t]))
    return torch.stack(ys, dim=1), Ws, Zs


def used(rule, gates):
    return {n: g for n, g in gates.items() if n in rule.gate_names}


def assert_state(state, Ws, Zs, alg, atol=1e-10):
    for i, w in enumerate(Ws, start=1):
        torch.testing.assert_close(state[f"W{i}"], w, rtol=0, atol=atol)
        if alg == "momentum":
            torch.testing.assert_close(state[f"Z.W{i}"], Zs[i - 1], rtol=0, atol=atol)


@pytest.mark.parametrize("bias,alg,ret,read", COMBOS, ids=IDS)
def test_sequential_matches_hand_loop(bias, alg, ret, read):
    rule = make_rule(bias, alg, ret, read)
    q, k, v, gates = make_inputs()
    with torch.no_grad():
        y, state = rule(q, k, v, gates=used(rule, gates), strategy="core:sequential")
    y_ref, Ws, Zs = hand_loop(rule, q, k, v, gates, bias, alg, ret, read)
    torch.testing.assert_close(y, y_ref, rtol=0, atol=1e-10)
    assert_state(state, Ws, Zs, alg)
    assert state["W1"].abs().max() > 1e-4  # the memory really moved (the state is the offset)


@pytest.mark.parametrize("bias,alg,ret,read", COMBOS, ids=IDS)
def test_chunkwise_chunk1_equals_sequential(bias, alg, ret, read):
    rule = make_rule(bias, alg, ret, read)
    q, k, v, gates = make_inputs()
    g = used(rule, gates)
    with torch.no_grad():
        y0, s0 = rule(q, k, v, gates=g, strategy="core:sequential")
        y1, s1 = rule(q, k, v, gates=g, strategy={"use": "core:chunkwise", "chunk_size": 1})
    torch.testing.assert_close(y1, y0, rtol=0, atol=1e-10)
    assert set(s1) == set(s0)
    for key in s0:
        torch.testing.assert_close(s1[key], s0[key], rtol=0, atol=1e-10)


ANCHORED = [(C, *c) for C in (4, 16, 64) for c in
            (("l2", "momentum", "decay", "after"), ("dot", "gd", "none", "before"))]


@pytest.mark.parametrize("C,bias,alg,ret,read", ANCHORED, ids=[f"C{a[0]}-" + "-".join(a[1:]) for a in ANCHORED])
def test_chunkwise_equals_hand_written_anchored_loop(C, bias, alg, ret, read):
    """T = 70 is no multiple of 4, 16 or 64 (C = 64: one full chunk and a ragged one). Small
    learning rates: a long anchored chunk with momentum overshoots at larger ones."""
    rule = make_rule(bias, alg, ret, read, anchor=C)
    q, k, v, gates = make_inputs(B=1, T=70, seed=2, theta=0.05)
    g = used(rule, gates)
    with torch.no_grad():
        y, s = rule(q, k, v, gates=g, strategy={"use": "core:chunkwise", "chunk_size": C})
        y_seq, _ = make_rule(bias, alg, ret, read)(q, k, v, gates=g, strategy="core:sequential")
    y_ref, Ws, Zs = hand_loop(rule, q, k, v, gates, bias, alg, ret, read, anchor_every=C)
    assert y.abs().max() < 100  # a meaningful absolute tolerance
    torch.testing.assert_close(y, y_ref, rtol=0, atol=1e-10)
    assert_state(s, Ws, Zs, alg)
    # the anchored rule is another rule than the per-token one (for dot too: a deep memory's
    # gradient depends on its weights even when the error does not)
    assert (y - y_seq).abs().max() > 1e-6


@pytest.mark.parametrize("split", [8, 6], ids=["on-boundary", "off-boundary"])
def test_state_carry_on_and_off_a_chunk_boundary(split):
    """On and off a chunk boundary two calls equal one call, and both equal the hand-written
    anchored loop over the whole sequence (the block grid is absolute, carried by the state)."""
    C = 4
    rule = make_rule("l2", "momentum", "decay", "after", anchor=C)
    q, k, v, gates = make_inputs(T=15, seed=3)
    strat = {"use": "core:chunkwise", "chunk_size": C}
    a = {n: x[:, :split] for n, x in gates.items()}
    b = {n: x[:, split:] for n, x in gates.items()}
    with torch.no_grad():
        y, s = rule(q, k, v, gates=gates, strategy=strat)
        y1, s1 = rule(q[:, :split], k[:, :split], v[:, :split], gates=a, strategy=strat)
        y2, s2 = rule(q[:, split:], k[:, split:], v[:, split:], gates=b, state=s1, strategy=strat)
    both = torch.cat([y1, y2], dim=1)
    torch.testing.assert_close(both, y, rtol=0, atol=1e-10)
    for key in s:
        torch.testing.assert_close(s2[key], s[key], rtol=0, atol=1e-10)
    y_ref, W_ref, Z_ref = hand_loop(rule, q, k, v, gates, "l2", "momentum", "decay", "after", anchor_every=C)
    torch.testing.assert_close(both, y_ref, rtol=0, atol=1e-10)
    assert_state(s2, W_ref, Z_ref, "momentum")


@pytest.mark.parametrize("strategy,anchor", [("core:sequential", 1), ({"use": "core:chunkwise", "chunk_size": 3}, 3)],
                         ids=["sequential", "chunkwise3"])
def test_gradients_reach_every_input_for_dot_gd_none(strategy, anchor):
    """The combination test_mlp.py does not cover: gradients reach q, k, v, theta and an explicit
    initial state (no alpha/eta gates here)."""
    rule = make_rule("dot", "gd", "none", "before", anchor=anchor)
    q, k, v, gates = make_inputs(T=7)
    leaves = [x.requires_grad_(True) for x in (q, k, v)]
    theta = gates["theta"].requires_grad_(True)
    S = rule.structure
    W0 = {f"W{i}": torch.full((2, *S.init[f"W{i}"].shape), 0.1, dtype=DT).requires_grad_(True)
          for i in (1, 2)}  # a non-zero offset from the learned initial weights
    state = rule.init_state(2, dtype=DT)
    state.update(W0)
    y, s = rule(q, k, v, gates={"theta": theta}, state=state, strategy=strategy)
    (y.pow(2).sum() + s["W1"].sum()).backward()
    for name, x in [("q", leaves[0]), ("k", leaves[1]), ("v", leaves[2]), ("theta", theta), *W0.items()]:
        assert x.grad is not None and torch.isfinite(x.grad).all() and x.grad.abs().max() > 0, name


@pytest.mark.parametrize("strategy,anchor", [("core:sequential", 1), ({"use": "core:chunkwise", "chunk_size": 2}, 2)],
                         ids=["sequential", "chunkwise2"])
def test_gradcheck_through_initial_weights_and_momenta(strategy, anchor):
    """test_mlp.py's gradcheck starts the momenta at zero; here they are inputs too."""
    torch.manual_seed(0)
    rule = ac.build_rule({"use": "titans:titans_deep", "read": "before", "anchor": anchor,
                          "structure": {"use": "titans:mlp", "expansion": 1.0, "activation": "tanh"}},
                         heads=1, d_key=2, d_value=2).to(DT)
    g = torch.Generator().manual_seed(4)
    args = [torch.randn(1, 3, 1, 2, generator=g, dtype=DT) for _ in range(3)]  # q, k, v
    args += [torch.randn(1, 3, 1, generator=g, dtype=DT) for _ in range(3)]  # gate logits
    args += [0.5 * torch.randn(1, 1, 2, 2, generator=g, dtype=DT) for _ in range(4)]  # W1, W2, Z1, Z2
    args = [a.requires_grad_(True) for a in args]

    def f(q, k, v, a, e, th, W1, W2, Z1, Z2):
        gates = {"alpha": torch.sigmoid(a), "eta": 0.9 * torch.sigmoid(e), "theta": 0.5 * torch.sigmoid(th)}
        state = rule.init_state(1, dtype=DT)  # (anchored: block position 0)
        state.update({"W1": W1, "W2": W2, "Z.W1": Z1, "Z.W2": Z2})
        y, s = rule(q, k, v, gates=gates, state=state, strategy=strategy)
        return y, s["W1"], s["Z.W2"]

    assert torch.autograd.gradcheck(f, tuple(args), eps=1e-6, atol=1e-6)
