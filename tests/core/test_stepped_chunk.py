"""``core:chunkwise`` on a nonlinear retention (the ``stepped_chunk`` form): MIRAS' Moneta (lq
retention) and Memora (KL retention) run in chunks inside their anchor blocks, equal to
``core:sequential`` in float64 (outputs, final state, gradients, any split of the sequence into
calls); chunk sizes that do not divide the anchor are refused with the reason."""

from __future__ import annotations

import pytest
import torch

import atlas_core as ac
from atlas_core.errors import StrategyError

H, DK, DV = 2, 4, 3
TOL = dict(rtol=1e-10, atol=1e-10)
CASES = [(1, 1), (4, 2), (4, 4)]  # (anchor, chunk size)
SPECS = {
    "moneta": {"use": "miras:moneta"},
    "memora": {"use": "miras:memora"},
    "moneta_before_momentum": {"use": "miras:moneta", "read": "before", "algorithm": "core:momentum"},
    "memora_window": {"use": "miras:memora", "bias": {"use": "omega:window", "window": 3}},
}


def _rule(name: str, anchor: int):
    return ac.build_rule({**SPECS[name], "anchor": anchor}, heads=H, d_key=DK, d_value=DV).double()


def _inputs(rule, B: int = 2, T: int = 13, seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    q, k = (torch.nn.functional.normalize(torch.randn(B, T, H, DK, generator=g, dtype=torch.float64), dim=-1)
            for _ in range(2))
    v = torch.randn(B, T, H, DV, generator=g, dtype=torch.float64)
    gates = {n: 0.3 + 0.6 * torch.rand(B, T, H, generator=g, dtype=torch.float64) for n in rule.gate_names}
    return q, k, v, gates


def _chunkwise(C: int) -> dict:
    return {"use": "core:chunkwise", "chunk_size": C}


def _close_states(got: dict, want: dict):
    assert set(got) == set(want)
    for key in want:
        torch.testing.assert_close(got[key], want[key], **TOL, msg=f"state {key}")


@pytest.mark.parametrize("name", list(SPECS))
@pytest.mark.parametrize("anchor, C", CASES)
def test_chunkwise_runs_the_nonlinear_retention_exactly(name, anchor, C):
    rule = _rule(name, anchor)
    assert rule.form.chunk_forms == {"stepped_chunk"}
    assert ac.host.manager.get_registry().build("strategy", _chunkwise(C)).supports(rule) == (True, "")
    q, k, v, gates = _inputs(rule)
    with torch.no_grad():  # from a non-zero state that ends inside an anchor block (5 tokens)
        _, s0 = rule(q[:, :5], k[:, :5], v[:, :5], gates={n: x[:, :5] for n, x in gates.items()},
                     strategy="core:sequential")
    leaves = [q, k, v, *gates.values()]
    for x in leaves:
        x.requires_grad_(True)
    y_ref, s_ref = rule(q, k, v, gates=gates, state=s0, strategy="core:sequential")
    y, s = rule(q, k, v, gates=gates, state=s0, strategy=_chunkwise(C))
    torch.testing.assert_close(y, y_ref, **TOL)
    _close_states(s, s_ref)
    g = torch.Generator().manual_seed(1)
    w_y = torch.randn(y.shape, generator=g, dtype=torch.float64)
    w_s = {key: torch.randn(x.shape, generator=g, dtype=torch.float64) for key, x in s_ref.items()
           if x.is_floating_point()}

    def loss(y, s):
        return (y * w_y).sum() + sum((s[key] * w).sum() for key, w in w_s.items())

    params = [p for p in rule.parameters() if p.requires_grad]
    want = torch.autograd.grad(loss(y_ref, s_ref), leaves + params, allow_unused=True)
    got = torch.autograd.grad(loss(y, s), leaves + params, allow_unused=True)
    for a, b in zip(got, want):
        assert (a is None) == (b is None)
        if b is not None:
            torch.testing.assert_close(a, b, **TOL)


@pytest.mark.parametrize("name", ["moneta", "memora"])
@pytest.mark.parametrize("anchor, C", CASES)
def test_any_split_into_calls_equals_one_sequential_call(name, anchor, C):
    rule = _rule(name, anchor)
    q, k, v, gates = _inputs(rule, T=15, seed=2)
    with torch.no_grad():
        y_ref, s_ref = rule(q, k, v, gates=gates, strategy="core:sequential")
        ys, state = [], None
        for lo, hi in ((0, 3), (3, 4), (4, 9), (9, 15)):  # calls that start inside blocks and chunks
            y, state = rule(q[:, lo:hi], k[:, lo:hi], v[:, lo:hi],
                            gates={n: x[:, lo:hi] for n, x in gates.items()}, state=state,
                            strategy=_chunkwise(C))
            ys.append(y)
    torch.testing.assert_close(torch.cat(ys, dim=1), y_ref, **TOL)
    _close_states(state, s_ref)


@pytest.mark.parametrize("name", ["moneta", "memora"])
def test_anchoring_is_a_different_function(name):
    """The comparison above can fail: the anchored rule is not the per-token one."""
    q, k, v, gates = _inputs(_rule(name, 1))
    with torch.no_grad():
        y1, _ = _rule(name, 1)(q, k, v, gates=gates, strategy="core:sequential")
        y4, _ = _rule(name, 4)(q, k, v, gates=gates, strategy=_chunkwise(4))
    assert (y1 - y4).abs().max() > 1e-4


@pytest.mark.parametrize("name", ["moneta", "memora"])
def test_chunk_sizes_that_do_not_fit_the_anchor_are_refused_with_the_reason(name):
    with pytest.raises(StrategyError, match=r"chunk_size=3 does not divide the rule's anchor=4.*e\.g\. 4"):
        _rule(name, 4)(*_inputs(_rule(name, 4))[:3], gates=_inputs(_rule(name, 4))[3], strategy=_chunkwise(3))
    per_token = _rule(name, 1)
    q, k, v, gates = _inputs(per_token)
    with pytest.raises(StrategyError, match=r"chunk_size=2 would take every gradient .*anchor = 2"):
        per_token(q, k, v, gates=gates, strategy=_chunkwise(2))
    with pytest.raises(StrategyError, match=r"per-token \(anchor = 1\)"):
        per_token(q, k, v, gates=gates, strategy="core:chunkwise")  # the default chunk size
    # auto: chunkwise at the anchor's default chunk for the anchored rule, the loop per token
    assert _rule(name, 4).runner("auto").name == "core:chunkwise"
    assert per_token.runner("auto").name == "core:sequential"
