"""core:exact_chunk (the WY / UT transform) equals the sequential delta rule for any chunk size.

Oracles: the hand-written loop of docs/math.md (tests/core/loops.py, no library objects) and
``core:sequential``; float64, 1e-10. Unlike core:chunkwise there is no anchoring: every chunk
size gives the sequential result. Momentum and Omega windows: test_exact_chunk_rules.py; fla-core's
published references: test_exact_chunk_fla.py.
"""

import pytest
import torch

import atlas_core as ac
from atlas_core.errors import StrategyError
from atlas_core.strategies.base import resolve_strategy

from .conftest import make_inputs
from .loops import linear_memory_loop

TOL = dict(atol=1e-10, rtol=0)


def _ec(C):
    return {"use": "core:exact_chunk", "chunk_size": C}


def _gates(rule, gates):
    return {n: gates[n] for n in rule.gate_names}


@pytest.mark.parametrize("read", ["after", "before"])
@pytest.mark.parametrize("retention", ["decay", "none"])
@pytest.mark.parametrize("T, C", [(150, 16), (150, 64), (300, 128), (41, 1), (37, 5), (20, 128)])
def test_equals_the_hand_written_loop(read, retention, T, C):
    q, k, v, gates = make_inputs(B=1, T=T, H=2, Dk=6, Dv=5, seed=T + C)
    M0 = 0.3 * torch.randn(1, 2, 5, 6, dtype=torch.float64)
    rule = ac.build_rule({"retention": f"core:{retention}", "read": read})
    y, s = rule(q, k, v, gates=_gates(rule, gates), state={"M": M0}, strategy=_ec(C))
    y_ref, M_ref = linear_memory_loop(q, k, v, gates, bias="l2", algorithm="gd",
                                      retention=retention, read=read, M0=M0)[:2]
    torch.testing.assert_close(y, y_ref, **TOL)
    torch.testing.assert_close(s["M"], M_ref, **TOL)


@pytest.mark.parametrize("T, C", [(150, 32), (77, 5)])
def test_inference_without_gradients_equals_the_loop_too(T, C):
    """Under no_grad the chunk loop reads each chunk's pieces from chunk-major copies."""
    q, k, v, gates = make_inputs(B=2, T=T, H=3, Dk=6, Dv=5, seed=T)
    M0 = 0.3 * torch.randn(2, 3, 5, 6, dtype=torch.float64)
    rule = ac.build_rule({"retention": "core:decay"})
    with torch.no_grad():
        y, s = rule(q, k, v, gates=_gates(rule, gates), state={"M": M0}, strategy=_ec(C))
    y_ref, M_ref = linear_memory_loop(q, k, v, gates, bias="l2", algorithm="gd",
                                      retention="decay", read="after", M0=M0)[:2]
    torch.testing.assert_close(y, y_ref, **TOL)
    torch.testing.assert_close(s["M"], M_ref, **TOL)


@pytest.mark.parametrize("C", [16, 64, 128])
def test_equals_sequential_where_chunkwise_is_only_anchored(C):
    """The same chunk size under core:chunkwise differs from sequential (anchored gradients);
    exact_chunk does not."""
    q, k, v, gates = make_inputs(B=2, T=2 * C + 7, H=2, Dk=8, Dv=8, seed=C)
    from atlas_core.errors import SpecError

    rule = ac.build_rule({"retention": "core:decay"})
    try:  # the anchored rule that core:chunkwise computes, named as such where rules have anchor
        anchored = ac.build_rule({"retention": "core:decay", "anchor": C})
    except SpecError:  # rules without the anchor key: core:chunkwise anchors the rule itself
        anchored = rule
    g = _gates(rule, gates)
    y_seq, s_seq = rule(q, k, v, gates=g, strategy="core:sequential")
    y_ec, s_ec = rule(q, k, v, gates=g, strategy=_ec(C))
    y_cw, _ = anchored(q, k, v, gates=g, strategy={"use": "core:chunkwise", "chunk_size": C})
    torch.testing.assert_close(y_ec, y_seq, **TOL)
    torch.testing.assert_close(s_ec["M"], s_seq["M"], **TOL)
    assert (y_cw - y_seq).abs().max() > 1e-4  # the anchoring approximation is visible


@pytest.mark.parametrize("split", [16, 23])  # on and off a chunk boundary
def test_state_carried_across_calls_equals_one_call(split):
    q, k, v, gates = make_inputs(B=2, T=50, H=2, Dk=4, Dv=3)
    rule = ac.build_rule({"retention": "core:decay", "read": "before"})
    g = _gates(rule, gates)
    y, s = rule(q, k, v, gates=g, strategy=_ec(16))
    part = lambda x, a, b: x[:, a:b]  # noqa: E731
    y1, s1 = rule(part(q, 0, split), part(k, 0, split), part(v, 0, split),
                  gates={n: part(x, 0, split) for n, x in g.items()}, strategy=_ec(16))
    y2, s2 = rule(part(q, split, 50), part(k, split, 50), part(v, split, 50),
                  gates={n: part(x, split, 50) for n, x in g.items()}, state=s1, strategy=_ec(16))
    torch.testing.assert_close(torch.cat([y1, y2], dim=1), y, **TOL)
    torch.testing.assert_close(s2["M"], s["M"], **TOL)


@pytest.mark.parametrize("read", ["after", "before"])
def test_gradients_equal_sequential(read):
    q, k, v, gates = make_inputs(B=1, T=21, H=2, Dk=4, Dv=3, requires_grad=True)
    rule = ac.build_rule({"retention": "core:decay", "read": read})
    g = _gates(rule, gates)
    M0 = (0.2 * torch.randn(1, 2, 3, 4, dtype=torch.float64)).requires_grad_()
    inputs = (q, k, v, M0, *g.values())

    def grads(strategy):
        y, s = rule(q, k, v, gates=g, state={"M": M0}, strategy=strategy)
        loss = y.sin().sum() + s["M"].square().sum()
        return torch.autograd.grad(loss, inputs)

    ref = grads("core:sequential")
    got = grads(_ec(8))
    for name, a, b in zip(["q", "k", "v", "M0", *g], got, ref):
        assert b.abs().sum() > 0, name
        torch.testing.assert_close(a, b, **TOL, msg=lambda m: f"gradient of {name}: {m}")


def test_gradcheck_tiny():
    q, k, v, gates = make_inputs(B=1, T=5, H=1, Dk=3, Dv=2, requires_grad=True)
    rule = ac.build_rule({"retention": "core:decay"})

    def f(q, k, v, alpha, theta):
        y, s = rule(q, k, v, gates={"alpha": alpha, "theta": theta}, strategy=_ec(2))
        return y, s["M"]

    assert torch.autograd.gradcheck(f, (q, k, v, gates["alpha"], gates["theta"]))


def test_a_gate_of_zero_clears_the_memory_exactly():
    q, k, v, gates = make_inputs(B=1, T=40, H=2, Dk=4, Dv=4)
    gates["alpha"][:, 13] = 0.0  # inside a chunk of 8
    gates["alpha"][:, 24] = 0.0  # on a chunk boundary
    rule = ac.build_rule({"retention": "core:decay"})
    g = _gates(rule, gates)
    y_ref, s_ref = rule(q, k, v, gates=g, strategy="core:sequential")
    y, s = rule(q, k, v, gates=g, strategy=_ec(8))
    torch.testing.assert_close(y, y_ref, **TOL)
    torch.testing.assert_close(s["M"], s_ref["M"], **TOL)


def test_feature_map_and_one_token_omega_window_are_supported():
    """phi is applied before the memory; a gated window of one token scales theta by gamma."""
    q, k, v, gates = make_inputs(B=1, T=30, H=2, Dk=4, Dv=4)
    gates["gamma"] = torch.rand(1, 30, 2, dtype=torch.float64)
    spec = {
        "retention": "core:decay",
        "bias": {"use": "omega:window", "window": 1, "gamma": "gate"},
        "feature_map": {"use": "omega:poly", "mode": "elementwise", "degree": 2},
    }
    rule = ac.build_rule(spec)
    g = _gates(rule, gates)
    assert resolve_strategy(rule, _ec(8)).name == "core:exact_chunk"
    y_ref, s_ref = rule(q, k, v, gates=g, strategy="core:sequential")
    y, s = rule(q, k, v, gates=g, strategy=_ec(8))
    torch.testing.assert_close(y, y_ref, **TOL)
    torch.testing.assert_close(s["M"], s_ref["M"], **TOL)


@pytest.mark.parametrize("spec, words", [
    ({"algorithm": "atlas_muon:muon"}, "momentum"),
    ({"bias": "core:dot", "algorithm": "core:momentum"}, "core:gd with the l2 or dot bias"),
    ({"structure": "titans:mlp"}, "linear matrix memory"),
])
def test_refuses_other_rules_with_a_reason(spec, words):
    from atlas_core.strategies.exact_chunk import ExactChunk

    rule = ac.build_rule(spec, heads=2, d_key=4, d_value=4)
    ok, reason = ExactChunk().supports(rule)
    assert not ok
    assert words in reason
    with pytest.raises(StrategyError, match="core:exact_chunk cannot run this rule"):
        resolve_strategy(rule, _ec(16))


def test_chunk_size_must_be_positive():
    from atlas_core.errors import SpecError

    rule = ac.build_rule({})
    with pytest.raises(SpecError, match="chunk_size"):
        resolve_strategy(rule, _ec(0))
