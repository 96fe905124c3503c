"""``atlas_muon:muon`` under ``core:sequential`` against hand-written loops of docs/math.md's equations
(float64, tiny sizes): linear memory with windows 1 and 8, deep ``titans:mlp`` memory."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

import atlas_core as ac

from .conftest import DT, make_inputs
from .loops import muon_linear_loop, muon_mlp_loop

WINDOW8 = {"use": "omega:window", "window": 8, "inner": "core:l2", "gamma": "gate"}


def linear_rule(window=1, read="after", anchor=1, **muon):
    """Linear memory, l2 (or an Omega window of ``window``), decay, Muon; ``anchor``: the rule's
    anchor block (1: per token)."""
    return ac.build_rule({
        "structure": "core:linear",
        "bias": WINDOW8 | {"window": window} if window > 1 else "core:l2",
        "retention": "core:decay",
        "algorithm": {"use": "atlas_muon:muon", **muon},
        "read": read,
        "anchor": anchor,
    })


def deep_rule(window=1, read="after", heads=2, d=4, anchor=1):
    return ac.build_rule({
        "structure": {"use": "titans:mlp", "depth": 2, "expansion": 1.5, "activation": "silu"},
        "bias": WINDOW8 | {"window": window} if window > 1 else "core:l2",
        "retention": "core:decay",
        "algorithm": "atlas_muon:muon",
        "read": read,
        "anchor": anchor,
    }, heads=heads, d_key=d, d_value=d).to(DT)


@pytest.mark.parametrize("window", [1, 8], ids=lambda c: f"c{c}")
@pytest.mark.parametrize("read", ["after", "before"])
def test_linear_sequential_matches_hand_loop(window, read):
    rule = linear_rule(window, read)
    q, k, v, gates = make_inputs(gamma=window > 1)
    y, state = rule(q, k, v, gates=gates, strategy="core:sequential")
    y_ref, ref = muon_linear_loop(q, k, v, gates, window=window, read=read, gamma=gates.get("gamma"))
    assert y.shape == (2, 11, 2, 4)
    assert set(state) == set(ref)
    torch.testing.assert_close(y, y_ref, rtol=0, atol=1e-10)
    for key in ref:
        torch.testing.assert_close(state[key], ref[key], rtol=0, atol=1e-10)
    assert state["Z.M"].abs().max() > 0.1  # the momentum really moved


@pytest.mark.parametrize("window", [1, 8], ids=lambda c: f"c{c}")
@pytest.mark.parametrize("read", ["after", "before"])
def test_anchored_sequential_matches_hand_loop(window, read):
    """anchor = 4 under core:sequential (the rule's reference loop): every gradient of a block of 4
    tokens (counted from the start of the sequence) at the block's start memory; the final state
    carries the position in the block (11 % 4 = 3) and the block's anchor memory (M after 8 tokens)."""
    rule = linear_rule(window, read, anchor=4)
    q, k, v, gates = make_inputs(gamma=window > 1)
    y, state = rule(q, k, v, gates=gates, strategy="core:sequential")
    y_ref, ref = muon_linear_loop(q, k, v, gates, window=window, read=read, anchor_every=4,
                                  gamma=gates.get("gamma"))
    assert set(state) == set(ref) | {"anchor.pos", "anchor.M"}
    torch.testing.assert_close(y, y_ref, rtol=0, atol=1e-10)
    for key in ref:
        torch.testing.assert_close(state[key], ref[key], rtol=0, atol=1e-10)
    assert state["anchor.pos"].tolist() == [3.0, 3.0]
    _, head = muon_linear_loop(q[:, :8], k[:, :8], v[:, :8], {n: g[:, :8] for n, g in gates.items()},
                               window=window, read=read, anchor_every=4,
                               gamma=gates["gamma"][:, :8] if "gamma" in gates else None)
    torch.testing.assert_close(state["anchor.M"], head["M"], rtol=0, atol=1e-10)
    y1, _ = linear_rule(window, read)(q, k, v, gates=gates, strategy="core:sequential")
    assert (y - y1).abs().max() > 1e-6  # the anchor is part of the rule


@pytest.mark.parametrize(
    "muon", [dict(ns_steps=0), dict(ns_steps=2, coefficients=(1.5, -0.5, 0.0))], ids=["k0", "k2-cubic"]
)
def test_ns_params_reach_the_rule(muon):
    rule = linear_rule(**muon)
    q, k, v, gates = make_inputs()
    y, state = rule(q, k, v, gates=gates)
    y_ref, ref = muon_linear_loop(q, k, v, gates, ns_steps=muon["ns_steps"],
                                  coeffs=muon.get("coefficients", (3.4445, -4.7750, 2.0315)))
    torch.testing.assert_close(y, y_ref, rtol=0, atol=1e-10)
    torch.testing.assert_close(state["M"], ref["M"], rtol=0, atol=1e-10)
    y5, _ = linear_rule()(q, k, v, gates=gates)
    assert (y - y5).abs().max() > 1e-3  # a different k really computes something different


def test_state_carries_into_the_loop():
    """A non-zero starting state (M, Z and a full window) enters the loop as the equations say."""
    rule = linear_rule(window=4)
    q, k, v, gates = make_inputs(T=6, gamma=True)
    g = torch.Generator().manual_seed(3)
    state = {
        "M": torch.randn(2, 2, 4, 4, generator=g, dtype=DT),
        "Z.M": torch.randn(2, 2, 4, 4, generator=g, dtype=DT),
        "window.k": torch.randn(2, 2, 3, 4, generator=g, dtype=DT),
        "window.v": torch.randn(2, 2, 3, 4, generator=g, dtype=DT),
        "window.gamma": torch.rand(2, 2, 3, generator=g, dtype=DT),
    }
    y, out = rule(q, k, v, gates=gates, state=state)
    y_ref, ref = muon_linear_loop(q, k, v, gates, window=4, gamma=gates["gamma"], state=state)
    torch.testing.assert_close(y, y_ref, rtol=0, atol=1e-10)
    for key in ref:
        torch.testing.assert_close(out[key], ref[key], rtol=0, atol=1e-10)


def _initial_weights(rule, B=2):
    S = rule.structure
    return [S.init[f"W{i}"].detach().unsqueeze(0).expand(B, *S.init[f"W{i}"].shape)
            for i in range(1, S.depth + 1)]


@pytest.mark.parametrize("window", [1, 8], ids=lambda c: f"c{c}")
@pytest.mark.parametrize("read", ["after", "before"])
def test_deep_sequential_matches_hand_loop(window, read):
    """titans:mlp: one Z per weight matrix (Z.W1, Z.W2), NS per matrix (W1 is 6x4, W2 is 4x6)."""
    rule = deep_rule(window, read)
    q, k, v, gates = make_inputs(T=9)
    gates.pop("gamma", None)
    if window > 1:  # gamma gate of ones: the hand loop weighs every window term 1
        gates["gamma"] = torch.ones_like(gates["alpha"])
    with torch.no_grad():
        y, state = rule(q, k, v, gates=gates, strategy="core:sequential")
    y_ref, Ws, Zs = muon_mlp_loop(_initial_weights(rule), q, k, v, gates, F.silu,
                                  window=window, read=read)
    assert {"W1", "W2", "Z.W1", "Z.W2"} <= set(state)
    assert state["W1"].shape == (2, 2, 6, 4) and state["W2"].shape == (2, 2, 4, 6)
    torch.testing.assert_close(y, y_ref, rtol=0, atol=1e-10)
    for i, (w, z) in enumerate(zip(Ws, Zs), start=1):
        torch.testing.assert_close(state[f"W{i}"], w, rtol=0, atol=1e-10)
        torch.testing.assert_close(state[f"Z.W{i}"], z, rtol=0, atol=1e-10)


def test_gradients_reach_every_input_sequential():
    rule = linear_rule(window=3)
    q, k, v, gates = make_inputs(T=5, gamma=True, requires_grad=True)
    y, state = rule(q, k, v, gates=gates)
    (y.square().sum() + state["M"].square().sum()).backward()
    for name, x in {"q": q, "k": k, "v": v, **gates}.items():
        assert x.grad is not None and torch.isfinite(x.grad).all(), name
        assert x.grad.abs().max() > 0, name


def test_zero_momentum_gives_no_nan():
    """v = 0 and M = 0: every gradient, hence Z, is exactly zero; NS(0) = 0, no NaN anywhere."""
    rule = linear_rule()
    q, k, v, gates = make_inputs(T=4, requires_grad=True)
    zero_v = torch.zeros_like(v, requires_grad=True)
    y, state = rule(q, k, zero_v, gates=gates)
    assert torch.equal(y, torch.zeros_like(y)) and torch.equal(state["Z.M"], torch.zeros_like(state["Z.M"]))
    y.sum().backward()
    for x in (q, k, zero_v, *gates.values()):
        assert torch.isfinite(x.grad).all()
