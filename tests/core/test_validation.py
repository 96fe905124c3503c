"""Bad input to a rule: one ValueError naming the argument and the shapes."""

import pytest
import torch

import atlas_core as ac
from atlas_core.errors import SpecError, StrategyError

from .conftest import make_inputs


@pytest.fixture
def rule():
    return ac.build_rule({"retention": "core:decay", "algorithm": "core:momentum"})


def test_wrong_rank(rule):
    q, k, v, g = make_inputs()
    with pytest.raises(ValueError, match=r"q must have 4 dimensions .*\(2, 11, 12\)"):
        rule(q.flatten(2), k, v, gates=g)


def test_mismatched_shapes(rule):
    q, k, v, g = make_inputs()
    with pytest.raises(ValueError, match=r"q and k must have the same shape"):
        rule(q, k[:, :5], v, gates=g)
    with pytest.raises(ValueError, match=r"v must be \[B, T, H, Dv\]"):
        rule(q, k, v[:, :5], gates=g)


def test_mismatched_dtype(rule):
    q, k, v, g = make_inputs()
    with pytest.raises(ValueError, match=r"v has dtype torch.float32 but q has torch.float64"):
        rule(q, k, v.float(), gates=g)


def test_missing_and_unknown_gates(rule):
    q, k, v, g = make_inputs()
    with pytest.raises(ValueError, match=r"missing gates \['eta'\]"):
        rule(q, k, v, gates={"alpha": g["alpha"], "theta": g["theta"]})
    with pytest.raises(ValueError, match=r"not used by this rule.*did you mean 'theta'"):
        rule(q, k, v, gates={**g, "thetaa": g["theta"]})
    with pytest.raises(ValueError, match=r"gates\['alpha'\] must be \[B, T, H\] = \[2, 11, 3\]"):
        rule(q, k, v, gates={**g, "alpha": g["alpha"][:, :3]})


def test_wrong_state(rule):
    q, k, v, g = make_inputs()
    with pytest.raises(ValueError, match=r"state has keys \['M'\] but this rule's state has \['M', 'Z.M'\]"):
        rule(q, k, v, gates=g, state={"M": torch.zeros(2, 3, 5, 4)})
    bad = {"M": torch.zeros(2, 3, 4, 4), "Z.M": torch.zeros(2, 3, 5, 4)}
    with pytest.raises(ValueError, match=r"state\['M'\] must have shape \(2, 3, 5, 4\), got \(2, 3, 4, 4\)"):
        rule(q, k, v, gates=g, state=bad)


def test_rebinding_to_other_sizes(rule):
    q, k, v, g = make_inputs()
    rule(q, k, v, gates=g)
    q2, k2, v2, g2 = make_inputs(H=2)
    with pytest.raises(ValueError, match=r"bound to heads=3"):
        rule(q2, k2, v2, gates=g2)


def test_unknown_knob_names_collected_with_suggestions():
    with pytest.raises(SpecError) as info:
        ac.build_rule({"bias": "core:l3", "algorithm": "core:momentun", "retension": "core:none"})
    text = str(info.value)
    assert "3 problems" in text
    assert "bias: unknown bias (got 'core:l3')" in text
    assert "'core:momentum'" in text
    assert "retension: unknown key; did you mean 'retention'?" in text


def test_missing_plugin_namespace_is_named():
    with pytest.raises(SpecError, match=r"namespace 'acme' is not installed|no installed plugin provides namespace 'acme'"):
        ac.build_rule({"bias": "acme:fancy"})


def test_bad_strategy_params():
    with pytest.raises(SpecError, match=r"parallel.chunk_size"):
        ac.build_rule({}).forward(*make_inputs()[:3], gates={"theta": make_inputs()[3]["theta"]},
                                  strategy={"use": "core:chunkwise", "chunk_size": 0})


def test_strategy_refusal_names_reason():
    from atlas_core.knobs.retention import Retention

    rule = ac.build_rule({})
    rule.retention = type("Softish", (Retention,), {"linear": False})()
    q, k, v, g = make_inputs()
    with pytest.raises(StrategyError, match=r"core:chunkwise cannot run this rule: retention .* is nonlinear"):
        rule(q, k, v, gates={"theta": g["theta"]}, strategy="core:chunkwise")
    # auto falls back to the reference
    y, _ = rule(q, k, v, gates={"theta": g["theta"]}, strategy="auto")
    assert y.shape == v.shape
