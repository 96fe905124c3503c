"""Bad input to a rule, continued: tensors on different devices (the ``meta`` device stands in for
a second device on a CPU-only machine) and gates of the wrong rank raise ValueError naming the
argument, its device or shape, and what the rule expected."""

import pytest
import torch

import atlas_core as ac

from .conftest import make_inputs


@pytest.fixture
def rule():
    return ac.build_rule({"retention": "core:decay", "algorithm": "core:momentum"})


def test_q_k_v_on_different_devices(rule):
    q, k, v, g = make_inputs()
    with pytest.raises(ValueError, match=r"^k is on meta but q is on cpu"):
        rule(q, k.to("meta"), v, gates=g)
    with pytest.raises(ValueError, match=r"^v is on meta but q is on cpu"):
        rule(q, k, v.to("meta"), gates=g)


def test_gate_on_another_device(rule):
    q, k, v, g = make_inputs()
    with pytest.raises(ValueError, match=r"gates\['eta'\] is on meta but q is on cpu"):
        rule(q, k, v, gates={**g, "eta": g["eta"].to("meta")})


def test_state_on_another_device(rule):
    q, k, v, g = make_inputs()
    _, state = rule(q, k, v, gates=g)
    state["Z.M"] = state["Z.M"].to("meta")
    with pytest.raises(ValueError, match=r"state\['Z.M'\] is on meta but the inputs are on cpu"):
        rule(q, k, v, gates=g, state=state)


def test_gate_of_the_wrong_rank(rule):
    q, k, v, g = make_inputs()
    with pytest.raises(ValueError, match=r"gates\['theta'\] must have 3 dimensions \[B, T, H\], got shape \(2, 11, 3, 1\)"):
        rule(q, k, v, gates={**g, "theta": g["theta"][..., None]})


def test_non_tensor_and_integer_inputs(rule):
    q, k, v, g = make_inputs()
    with pytest.raises(ValueError, match=r"^v must be a torch.Tensor \[B, T, H, D\], got list"):
        rule(q, k, v.tolist(), gates=g)
    with pytest.raises(ValueError, match=r"^q must be a floating-point tensor, got dtype torch.int64"):
        rule(q.long(), k, v, gates=g)


def test_mru_state_on_another_device():
    mru = ac.build_rule({"use": "mru:mru"})
    with pytest.raises(ValueError, match=r"state\['H'\] is on meta but X is on cpu"):
        mru(torch.randn(1, 3, 2, 2, 2), state={"H": torch.zeros(1, 2, 2, 2, device="meta")})
