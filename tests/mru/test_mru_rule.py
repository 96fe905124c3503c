"""``mru:mru`` through the registry and the rule contract: every ``mru:*`` strategy equals
``core:sequential`` (forward, final state, gradients), state carry, refusal of other rules, and
bad input."""

from __future__ import annotations

import pytest
import torch

import atlas_core as ac
from atlas_core.errors import SpecError, StrategyError
from atlas_core.strategies.base import resolve_strategy
from atlas_plugins.mru.rule import MRURule

SCANS = ["mru:hillis_steele", "mru:brent_kung", "mru:sklansky"]


def rotations(B: int, T: int, H: int, d: int, seed: int, dtype=torch.float64) -> torch.Tensor:
    gen = torch.Generator().manual_seed(seed)
    A = torch.randn(B, T, H, d, d, generator=gen, dtype=dtype)
    return torch.linalg.matrix_exp(A - A.mT) * (1 + 0.02 * torch.randn(B, T, H, 1, 1, generator=gen, dtype=dtype))


def test_builds_by_name():
    rule = ac.build_rule({"use": "mru:mru"})
    assert isinstance(rule, MRURule)
    assert rule.spec == {"use": "mru:mru"}
    assert resolve_strategy(rule, "auto").name.startswith("mru:")


def test_sequential_runs_the_rule_reference(monkeypatch):
    rule = ac.build_rule({"use": "mru:mru"})
    calls = []
    original = rule.reference
    monkeypatch.setattr(rule, "reference", lambda inputs: calls.append(1) or original(inputs))
    X = rotations(1, 4, 2, 2, seed=0)
    H, state = rule(X, strategy="core:sequential")
    assert calls == [1]
    # the loop written out here, independently of the plugin
    expect = X[:, 0]
    torch.testing.assert_close(H[:, 0], expect, rtol=0, atol=0)
    for t in range(1, 4):
        expect = expect @ X[:, t]
        torch.testing.assert_close(H[:, t], expect, rtol=0, atol=1e-14)
    torch.testing.assert_close(state["H"], expect, rtol=0, atol=1e-14)


@pytest.mark.parametrize("T", [1, 2, 7, 64], ids=lambda t: f"T{t}")
@pytest.mark.parametrize("strategy", SCANS)
def test_scan_strategy_equals_sequential(strategy: str, T: int):
    rule = ac.build_rule({"use": "mru:mru"})
    X = rotations(2, T, 2, 3, seed=T).requires_grad_()
    h0 = rotations(2, 1, 2, 3, seed=T + 100)[:, 0].requires_grad_()
    gen = torch.Generator().manual_seed(7)
    G = torch.randn(2, T, 2, 3, 3, generator=gen, dtype=torch.float64)
    GS = torch.randn(2, 2, 3, 3, generator=gen, dtype=torch.float64)

    def run(name):
        H, state = rule(X, state={"H": h0}, strategy=name)
        loss = (H * G).sum() + (state["H"] * GS).sum()  # gradient through the final state too
        return H, state["H"], torch.autograd.grad(loss, (X, h0))

    H_ref, S_ref, g_ref = run("core:sequential")
    H, S, g = run(strategy)
    torch.testing.assert_close(H, H_ref, rtol=0, atol=1e-10)
    torch.testing.assert_close(S, S_ref, rtol=0, atol=1e-10)
    for a, b in zip(g, g_ref):
        torch.testing.assert_close(a, b, rtol=0, atol=1e-10)


@pytest.mark.parametrize("strategy", ["core:sequential", *SCANS])
def test_state_carry(strategy: str):
    rule = ac.build_rule({"use": "mru:mru"})
    X = rotations(1, 13, 2, 2, seed=1)
    H, state = rule(X, strategy=strategy)
    H1, s1 = rule(X[:, :5], strategy=strategy)
    H2, s2 = rule(X[:, 5:], state=s1, strategy=strategy)
    torch.testing.assert_close(torch.cat([H1, H2], 1), H, rtol=0, atol=1e-12)
    torch.testing.assert_close(s2["H"], state["H"], rtol=0, atol=1e-12)


def test_parallel_in_the_rule_spec_is_the_default_strategy():
    rule = ac.build_rule({"use": "mru:mru", "parallel": "mru:sklansky"})
    assert rule.default_strategy == "mru:sklansky"
    X = rotations(1, 6, 1, 2, seed=2)
    torch.testing.assert_close(rule(X)[0], rule(X, strategy="core:sequential")[0], rtol=0, atol=1e-12)


def test_half_precision_computes_in_float32():
    rule = ac.build_rule({"use": "mru:mru"})
    X = rotations(1, 9, 2, 2, seed=3, dtype=torch.float32)
    H, state = rule(X.bfloat16(), strategy="mru:brent_kung")
    assert H.dtype == torch.bfloat16 and state["H"].dtype == torch.float32
    ref, _ = rule(X.bfloat16().float(), strategy="core:sequential")
    torch.testing.assert_close(state["H"], ref[:, -1], rtol=0, atol=1e-5)


@pytest.mark.parametrize("strategy", SCANS)
def test_scans_refuse_composed_rules(strategy: str):
    composed = ac.build_rule({"bias": "core:l2", "algorithm": "core:gd"})
    strat = ac.resolve_strategy(ac.build_rule({"use": "mru:mru"}), strategy)
    ok, reason = strat.supports(composed)
    assert not ok and "mru:mru" in reason
    with pytest.raises(StrategyError, match="mru:mru"):
        resolve_strategy(composed, strategy)
    assert not resolve_strategy(composed, "auto").name.startswith("mru:")


def test_chunkwise_refuses_the_mru_rule():
    rule = ac.build_rule({"use": "mru:mru"})
    with pytest.raises(StrategyError):
        rule(rotations(1, 3, 1, 2, seed=0), strategy="core:chunkwise")


# -- bad input --------------------------------------------------------------------------------


def test_non_square_x():
    rule = ac.build_rule({"use": "mru:mru"})
    with pytest.raises(ValueError, match=r"3 x 2"):
        rule(torch.randn(1, 4, 2, 3, 2))


def test_wrong_rank_and_dtype():
    rule = ac.build_rule({"use": "mru:mru"})
    with pytest.raises(ValueError, match=r"5 dimensions.*\(4, 2, 3, 3\)"):
        rule(torch.randn(4, 2, 3, 3))
    with pytest.raises(ValueError, match="floating-point"):
        rule(torch.ones(1, 2, 1, 2, 2, dtype=torch.long))


def test_state_of_the_wrong_shape():
    rule = ac.build_rule({"use": "mru:mru"})
    X = torch.randn(2, 4, 3, 2, 2)
    with pytest.raises(ValueError, match=r"\[2, 3, 2, 2\].*\(2, 3, 3, 3\)"):
        rule(X, state={"H": torch.randn(2, 3, 3, 3)})
    with pytest.raises(ValueError, match="keys"):
        rule(X, state={"M": torch.randn(2, 3, 2, 2)})


def test_params_are_rejected():
    with pytest.raises(SpecError, match="takes no parameters"):
        ac.build_rule({"use": "mru:mru", "order": 3})
