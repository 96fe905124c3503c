"""A rule's sizes are bound only by a call whose inputs passed validation: a refused call (bad
gates, a bad state) leaves the rule free to take the sizes of the next, correct call."""

import pytest
import torch

import atlas_core as ac


def _call(rule, B=1, T=3, H=2, D=4, gates=None, state=None):
    q, k, v = (torch.randn(B, T, H, D) for _ in range(3))
    if gates is None:
        gates = {n: torch.full((B, T, H), 0.5) for n in rule.gate_names}
    return rule(q, k, v, gates=gates, state=state)


def test_bad_gates_do_not_bind_the_sizes():
    rule = ac.build_rule("titans:titans")
    with pytest.raises(ValueError, match="gates"):
        _call(rule, H=2, D=4, gates={"alpha": torch.ones(1, 3, 2)})  # eta and theta missing
    assert not rule.structure.bound
    y, _ = _call(rule, H=3, D=5)  # other sizes: accepted
    assert y.shape == (1, 3, 3, 5)


def test_a_bad_state_does_not_bind_the_sizes():
    rule = ac.build_rule("titans:titans")
    with pytest.raises(ValueError, match="state"):
        _call(rule, H=2, D=4, state={"M": torch.zeros(1, 2, 4, 4)})  # Z.M missing
    assert not rule.structure.bound
    y, st = _call(rule, H=3, D=5)
    assert st["M"].shape == (1, 3, 5, 5)


def test_a_valid_call_binds_and_other_sizes_are_then_refused():
    rule = ac.build_rule("titans:titans")
    _call(rule, H=2, D=4)
    with pytest.raises(ValueError, match="bound to heads=2"):
        _call(rule, H=3, D=4)
