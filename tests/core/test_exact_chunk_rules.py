"""core:exact_chunk on momentum (Titans) and Omega windows equals core:sequential at any chunk size.

Every case compares outputs, the final state (all keys) and the gradients with respect to q, k, v,
every gate and every key of a nonzero initial state with the rule's reference loop
(``core:sequential``), float64, 1e-9 relative. Sequence lengths are not multiples of the chunk
size, so the padded last chunk is covered.
"""

import pytest
import torch

import atlas_core as ac
from atlas_core.errors import StrategyError
from atlas_core.strategies.base import resolve_strategy
from atlas_core.strategies.exact_chunk import ExactChunk

B, H, DK, DV = 2, 2, 4, 3
RTOL = 1e-9

OMEGA4 = {"use": "omega:window", "window": 4, "inner": "core:l2", "gamma": "gate"}
RULES = {
    "titans": {"use": "titans:titans"},
    "delta_decay": {"retention": "core:decay"},
    "omega4_gd": {"bias": OMEGA4, "retention": "core:decay"},
    "omega4_momentum": {"bias": OMEGA4, "retention": "core:decay", "algorithm": "core:momentum"},
    # the other lag weightings, no retention, and a window longer than a chunk of 1 or 2
    "omega3_decay_momentum": {
        "bias": {"use": "omega:window", "window": 3, "inner": "core:l2", "gamma": "decay", "decay": 0.5},
        "algorithm": "core:momentum",
    },
    "omega5_uniform_gd": {"bias": {"use": "omega:window", "window": 5, "inner": "core:l2"}},
}


@pytest.fixture(autouse=True)
def _one_intra_op_thread():
    """Tiny tensors gain nothing from intra-op threads; on a busy 2-core machine waking the pool
    costs more than the work. Restored after each test."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


def _rule(name, read):
    return ac.build_rule({**RULES[name], "read": read}, heads=H, d_key=DK, d_value=DV)


def _inputs(rule, T, seed):
    """q, k, v ([B, T, H, D]), the rule's gates and a nonzero initial state, all leaves."""
    g = torch.Generator().manual_seed(seed)
    f64 = dict(generator=g, dtype=torch.float64)
    q = torch.randn(B, T, H, DK, **f64)
    k = torch.nn.functional.normalize(torch.randn(B, T, H, DK, **f64), dim=-1)
    v = torch.randn(B, T, H, DV, **f64)
    ranges = {"alpha": (0.7, 1.0), "eta": (0.0, 0.9), "theta": (0.05, 0.3), "gamma": (0.2, 1.0)}
    gates = {}
    for n in rule.gate_names:
        lo, hi = ranges[n]
        gates[n] = lo + (hi - lo) * torch.rand(B, T, H, **f64)
    state = {}
    for key, x in rule.init_state(B, dtype=torch.float64).items():
        if key == "window.gamma":
            state[key] = 0.2 + 0.8 * torch.rand(x.shape, **f64)
        elif key == "window.k":
            state[key] = torch.nn.functional.normalize(torch.randn(x.shape, **f64), dim=-1)
        else:
            state[key] = 0.3 * torch.randn(x.shape, **f64)
    for x in (q, k, v, *gates.values(), *state.values()):
        x.requires_grad_(True)
    return q, k, v, gates, state


def _run(rule, inputs, strategy):
    """Outputs, final state and the gradients of a loss touching every output and state key."""
    q, k, v, gates, state = inputs
    y, s = rule(q, k, v, gates=gates, state=state, strategy=strategy)
    g = torch.Generator().manual_seed(1)
    loss = y.sin().sum() + sum((x * torch.randn(x.shape, generator=g, dtype=x.dtype)).sum()
                               for _, x in sorted(s.items()))
    names = ["q", "k", "v", *(f"gate {n}" for n in gates), *(f"state {n}" for n in state)]
    leaves = [q, k, v, *gates.values(), *state.values()]
    grads = torch.autograd.grad(loss, leaves)
    return y.detach(), {n: x.detach() for n, x in s.items()}, dict(zip(names, grads))


def _close(got, want, what):
    scale = want.abs().max().item()
    assert scale > 0, f"{what}: the reference is zero, the test would prove nothing"
    err = (got - want).abs().max().item()
    assert err <= RTOL * scale, f"{what}: max error {err:.3e} against scale {scale:.3e}"


_REFERENCE = {}


def _reference(name, read, T):
    key = (name, read, T)
    if key not in _REFERENCE:
        rule = _rule(name, read)
        inputs = _inputs(rule, T, seed=T)
        _REFERENCE[key] = _run(rule, inputs, "core:sequential")
    return _REFERENCE[key]


def _ec(C):
    return {"use": "core:exact_chunk", "chunk_size": C}


@pytest.mark.parametrize("C", [1, 5, 16, 64])
@pytest.mark.parametrize("T", [37, 100])
@pytest.mark.parametrize("read", ["after", "before"])
@pytest.mark.parametrize("name", ["titans", "delta_decay", "omega4_gd", "omega4_momentum"])
def test_outputs_state_and_gradients_equal_sequential(name, read, T, C):
    rule = _rule(name, read)
    y_ref, s_ref, g_ref = _reference(name, read, T)
    y, s, g = _run(rule, _inputs(rule, T, seed=T), _ec(C))
    _close(y, y_ref, "outputs")
    assert set(s) == set(s_ref)
    for key in s_ref:
        _close(s[key], s_ref[key], f"final state {key}")
    for what in g_ref:
        _close(g[what], g_ref[what], f"gradient of {what}")


@pytest.mark.parametrize("C", [1, 2, 7])
@pytest.mark.parametrize("name", ["omega3_decay_momentum", "omega5_uniform_gd"])
def test_other_lag_weights_and_short_chunks(name, C):
    """A window longer than the chunk (C = 1, 2 with c = 3, 5), lag decay and uniform weights,
    no retention."""
    rule = _rule(name, "after")
    y_ref, s_ref, g_ref = _reference(name, "after", 23)
    y, s, g = _run(rule, _inputs(rule, 23, seed=23), _ec(C))
    _close(y, y_ref, "outputs")
    for key in s_ref:
        _close(s[key], s_ref[key], f"final state {key}")
    for what in g_ref:
        _close(g[what], g_ref[what], f"gradient of {what}")


@pytest.mark.parametrize("cuts", [(50,), (16, 61), (1, 99)])
@pytest.mark.parametrize("name", ["titans", "omega4_gd", "omega4_momentum"])
def test_calls_carrying_the_state_equal_one_call(name, cuts):
    rule = _rule(name, "before" if name == "omega4_gd" else "after")
    q, k, v, gates, state = _inputs(rule, 100, seed=5)
    with torch.no_grad():
        y, s = rule(q, k, v, gates=gates, state=state, strategy=_ec(16))
        bounds = (0, *cuts, 100)
        ys, st = [], state
        for a, b in zip(bounds[:-1], bounds[1:]):
            part = lambda x: x[:, a:b]  # noqa: E731
            yp, st = rule(part(q), part(k), part(v), gates={n: part(x) for n, x in gates.items()},
                          state=st, strategy=_ec(16))
            ys.append(yp)
    _close(torch.cat(ys, dim=1), y, "outputs")
    for key in s:
        _close(st[key], s[key], f"final state {key}")


def test_an_empty_call_returns_the_state_unchanged():
    rule = _rule("omega4_momentum", "after")
    q, k, v, gates, state = _inputs(rule, 0, seed=0)
    y, s = rule(q, k, v, gates=gates, state=state, strategy=_ec(8))
    assert y.shape == (B, 0, H, DV)
    for key in state:
        torch.testing.assert_close(s[key], state[key], atol=0, rtol=0)


def test_a_zero_gate_inside_and_on_a_chunk_boundary():
    """alpha = 0 clears the memory, eta = 0 the momentum: exactly, wherever they fall."""
    rule = _rule("titans", "after")
    q, k, v, gates, state = _inputs(rule, 40, seed=3)
    with torch.no_grad():
        for n, t in (("alpha", 13), ("alpha", 24), ("eta", 7), ("eta", 32)):
            gates[n][:, t] = 0.0
        y_ref, s_ref = rule(q, k, v, gates=gates, state=state, strategy="core:sequential")
        y, s = rule(q, k, v, gates=gates, state=state, strategy=_ec(8))
    _close(y, y_ref, "outputs")
    for key in s_ref:
        _close(s[key], s_ref[key], f"final state {key}")


@pytest.mark.parametrize("spec, words", [
    ({"algorithm": "atlas_muon:muon"}, "neither core:gd nor core:momentum"),
    ({"bias": "core:dot", "algorithm": "core:momentum"}, "core:gd with the l2 or dot bias"),
    ({"bias": {"use": "omega:window", "window": 4, "inner": "miras:huber"}}, "not the l2 (delta-rule) bias"),
    ({"bias": "miras:lp"}, "not the l2 (delta-rule) bias"),
    ({"structure": "titans:mlp"}, "not a linear matrix memory"),
    ({"retention": "miras:lq"}, "not a scalar decay"),
])
def test_refusals_name_the_reason(spec, words):
    rule = ac.build_rule(spec, heads=2, d_key=4, d_value=4)
    ok, reason = ExactChunk().supports(rule)
    assert not ok
    assert words in reason
    with pytest.raises(StrategyError, match="core:exact_chunk cannot run this rule"):
        resolve_strategy(rule, _ec(16))


def test_refuses_an_anchored_rule():
    """An anchored rule (gradients at a block's start) is run by core:chunkwise."""
    rule = ac.build_rule({"use": "titans:titans"}, heads=2, d_key=4, d_value=4)
    assert ExactChunk().supports(rule) == (True, "")
    rule.anchor = 64
    ok, reason = ExactChunk().supports(rule)
    assert not ok
    assert "anchor = 64" in reason and "core:chunkwise" in reason
