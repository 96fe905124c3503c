"""The ``mru:*`` strategies run the rule through their own closed-form ``autograd.Function`` (not
autograd through the scan), and both passes take O(log T) sequential steps: counted on the real
combine calls of a forward and a backward at T = 1000 (each call is one parallel level)."""

from __future__ import annotations

import math

import pytest
import torch

import atlas_core as ac
from atlas_plugins.mru import cumprod as cp

STRATEGIES = {"mru:hillis_steele": "HillisSteeleCumprod", "mru:brent_kung": "BrentKungCumprod",
              "mru:sklansky": "SklanskyCumprod"}


def graph(fn) -> list[str]:
    """Names of every autograd node behind ``fn``."""
    seen, todo, names = set(), [fn], []
    while todo:
        f = todo.pop()
        if f is None or f in seen:
            continue
        seen.add(f)
        names.append(type(f).__name__)
        todo.extend(n for n, _ in f.next_functions)
    return names


@pytest.mark.parametrize("strategy", list(STRATEGIES))
def test_custom_backward_and_logarithmic_depth(strategy, monkeypatch):
    T, levels = 1000, math.ceil(math.log2(1000))
    calls = {"forward": 0, "backward": 0}
    real_mm, real_aff = cp._matmul, cp._affine

    def mm(a, b):
        calls["forward"] += 1
        return real_mm(a, b)

    def aff(a, b):
        calls["backward"] += 1
        return real_aff(a, b)

    monkeypatch.setattr(cp, "_matmul", mm)
    monkeypatch.setattr(cp, "_affine", aff)
    rule = ac.build_rule({"use": "mru:mru"})
    A = torch.randn(1, T, 1, 2, 2, dtype=torch.float64, generator=torch.Generator().manual_seed(0))
    X = torch.linalg.matrix_exp(A - A.mT).requires_grad_()
    H, _ = rule(X, strategy=strategy)
    nodes = graph(H.grad_fn)
    assert STRATEGIES[strategy] + "Backward" in nodes  # the closed-form backward
    assert len(nodes) < 8, nodes  # and no autograd graph through the scan's levels
    H.backward(torch.ones_like(H))
    assert 0 < calls["forward"] <= 2 * levels and 0 < calls["backward"] <= 2 * levels, calls
    assert torch.isfinite(X.grad).all()


def test_the_loop_takes_t_steps(monkeypatch):
    """The counting above can fail: the sequential reference really takes T - 1 steps."""
    calls = []
    monkeypatch.setattr(cp, "_matmul", lambda a, b: calls.append(1) or a @ b)
    cp.cumprod(torch.randn(50, 2, 2, dtype=torch.float64), None, "sequential")
    assert len(calls) == 49
