"""Presets, the example spec, parameter validation and composition checks of ``atlas_muon``."""

from __future__ import annotations

import subprocess
import sys
import tomllib
from pathlib import Path

import pytest
import torch

import atlas_core as ac
from atlas_core.components.decay import DecayRetention
from atlas_core.components.identity import build as identity
from atlas_core.components.l2 import build as l2
from atlas_core.errors import SpecError, StrategyError
from atlas_core.knobs.structure import Structure
from atlas_core.rule import ComposedRule
from atlas_plugins.atlas_muon.muon import Muon

from .conftest import DT, make_inputs

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "atlas_lmm.toml"


def issues(exc: SpecError):
    return {i.path: i for i in exc.issues}


# -- bad input ------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    "algorithm, path, text",
    [
        ({"ns_steps": -1}, "memory.algorithm.ns_steps", "greater than or equal to 0"),
        ({"coefficients": [3.4, float("inf"), 2.0]}, "memory.algorithm.coefficients", "finite"),
        ({"coefficients": [3.4, float("nan"), 2.0]}, "memory.algorithm.coefficients", "finite"),
        ({"coefficients": [3.4, 2.0]}, "memory.algorithm.coefficients", "three numbers"),
        ({"ns_step": 5}, "memory.algorithm.ns_step", "unknown key"),
        ({"ns_steps": True}, "memory.algorithm.ns_steps", "valid integer"),
    ],
    ids=["ns_steps", "inf", "nan", "two", "typo", "bool"],
)
def test_bad_algorithm_params(algorithm, path, text):
    with pytest.raises(SpecError) as err:
        ac.build_rule({"algorithm": {"use": "atlas_muon:muon", **algorithm}}, path="memory")
    found = issues(err.value)
    assert path in found, str(err.value)
    assert text in found[path].message or text in str(err.value)


def test_bad_strategy_params():
    rule = ac.build_rule({"retention": "core:decay", "algorithm": "atlas_muon:muon"})
    q, k, v, gates = make_inputs(T=3)
    with pytest.raises(SpecError, match=r"parallel.chunk_size: Input should be greater than or equal to 1"):
        rule(q, k, v, gates=gates, strategy={"use": "atlas_muon:atlas_parallel", "chunk_size": 0})
    with pytest.raises(SpecError, match=r"parallel.checkpont: unknown key.*did you mean 'checkpoint'"):
        rule(q, k, v, gates=gates, strategy={"use": "atlas_muon:atlas_parallel", "checkpont": True})


class VectorMemory(Structure):
    """A memory whose weight is a vector (not a matrix): Muon cannot orthogonalise it."""

    matrix_shaped = False

    def weight_shapes(self):
        return {"m": (self.d_out,)}


def test_non_matrix_structure_is_a_spec_error_at_algorithm():
    muon = Muon()
    with pytest.raises(SpecError) as err:
        ComposedRule(VectorMemory(), l2(None, None), DecayRetention(), muon, identity(None, None),
                     spec={"structure": "acme:vector", "algorithm": "atlas_muon:muon"})
    found = issues(err.value)
    assert list(found) == ["algorithm"]
    assert "'acme:vector'" in found["algorithm"].message and "not matrices" in found["algorithm"].message
    assert found["algorithm"].value == "atlas_muon:muon"


def test_non_matrix_weight_at_run_time_is_a_value_error():
    muon = Muon()
    with pytest.raises(ValueError, match=r"weight 'm' has shape \(2, 3, 5\)"):
        muon.step({"m": torch.zeros(2, 3, 5)}, {"Z.m": torch.zeros(2, 3, 5)}, {"m": torch.ones(2, 3, 5)},
                  alpha=torch.ones(2, 3), gates={"eta": torch.ones(2, 3), "theta": torch.ones(2, 3)},
                  retention=DecayRetention())


def test_matrix_structures_pass_the_check():
    for structure in ("core:linear", "titans:mlp"):
        rule = ac.build_rule({"structure": structure, "algorithm": "atlas_muon:muon"})
        assert rule.algorithm.check_composition(rule) == []
        assert "Z.M" in rule.state_keys() or "Z.W1" in rule.state_keys()


# -- presets --------------------------------------------------------------------------------------
@pytest.mark.parametrize("preset, structure", [("atlas_muon:atlas", "titans:mlp"),
                                               ("atlas_muon:atlas_linear", "core:linear")])
def test_presets_compose_the_atlas_knobs(preset, structure):
    rule = ac.build_rule({"use": preset}, heads=2, d_key=4, d_value=4).to(DT)
    spec = rule.spec
    assert spec["use"] == preset
    assert spec["structure"] == structure
    assert spec["bias"]["use"] == "omega:window" and spec["bias"]["window"] == 8
    assert spec["feature_map"]["use"] == "omega:poly" and spec["retention"] == "core:decay"
    assert isinstance(rule.algorithm, Muon) and rule.algorithm.ns_steps == 5
    assert set(rule.gate_names) == {"alpha", "eta", "theta", "gamma"}
    assert rule.anchor == 16 and spec["anchor"] == 16  # Atlas' chunked gradients are the rule
    q, k, v, gates = make_inputs(T=20, gamma=True)
    with torch.no_grad():
        seq = rule(q, k, v, gates=gates, strategy="core:sequential")
        for parallel in ({"chunk_size": 1}, {"chunk_size": 4}, {"chunk_size": 16}, {}):
            got = rule(q, k, v, gates=gates, strategy={"use": "atlas_muon:atlas_parallel", **parallel})
            torch.testing.assert_close(got[0], seq[0], rtol=0, atol=1e-10)
            assert set(got[1]) == set(seq[1])
            for key in seq[1]:
                torch.testing.assert_close(got[1][key], seq[1][key], rtol=0, atol=1e-10)
        per_token = ac.build_rule({"use": preset, "anchor": 1}, heads=2, d_key=4, d_value=4).to(DT)
        per_token.load_state_dict(rule.state_dict())
        tok = per_token(q, k, v, gates=gates, strategy="core:sequential")
    assert "window.k" in seq[1] and seq[1]["window.k"].shape == (2, 2, 7, 4)
    assert seq[1]["anchor.pos"].tolist() == [4.0, 4.0]  # 20 tokens: 4 into the second block
    assert (tok[0] - seq[0]).abs().max() > 1e-6  # anchor = 1 is another rule
    with pytest.raises(StrategyError, match=r"atlas_parallel cannot run this rule: .*anchor"):
        per_token(q, k, v, gates=gates, strategy={"use": "atlas_muon:atlas_parallel", "chunk_size": 4})


def test_preset_override_and_learned_feature_map_gradients():
    rule = ac.build_rule({"use": "atlas_muon:atlas_linear",
                          "algorithm": {"use": "atlas_muon:muon", "ns_steps": 3}},
                         heads=2, d_key=4, d_value=4).to(DT)
    assert rule.algorithm.ns_steps == 3
    q, k, v, gates = make_inputs(T=6, gamma=True)
    y, _ = rule(q, k, v, gates=gates, strategy={"use": "atlas_muon:atlas_parallel", "chunk_size": 4})
    y.square().sum().backward()
    grads = [p.grad for p in rule.feature_map.parameters()]
    assert grads and all(g is not None and torch.isfinite(g).all() and g.abs().max() > 0 for g in grads)


# -- the example spec -----------------------------------------------------------------------------
def test_example_spec_resolves_and_a_small_model_runs():
    spec = ac.load_spec(EXAMPLE)
    memory = spec.memory
    assert memory["use"] == "atlas_muon:atlas"
    assert memory["parallel"]["use"] == "atlas_muon:atlas_parallel"
    assert memory["algorithm"] == {"use": "atlas_muon:muon", "ns_steps": 5,
                                   "coefficients": [3.4445, -4.775, 2.0315]}
    assert memory["anchor"] == 16 and memory["parallel"]["chunk_size"] == 16
    raw = tomllib.loads(EXAMPLE.read_text())
    raw["model"].update(vocab_size=32, d_model=8, depth=1, heads=2)  # tiny, same rule
    model = ac.build_model(raw)
    layer = model.blocks[0].memory
    assert layer.rule.anchor == 16 and layer.runner.name == "atlas_muon:atlas_parallel"
    ids = torch.randint(0, 32, (1, 6))
    logits = model(ids)
    assert logits.shape == (1, 6, 32) and torch.isfinite(logits).all()


def test_plugin_entry_module_is_cheap():
    code = ("import sys, atlas_plugins.atlas_muon.plugin as p; "
            "assert hasattr(p, 'atlas_register'); "
            "assert 'torch' not in sys.modules, 'torch imported'")
    subprocess.run([sys.executable, "-c", code], check=True)


def test_components_are_registered_with_params():
    reg = ac.get_registry()
    muon = reg.get("algorithm", "atlas_muon:muon")
    assert muon.load_params()().ns_steps == 5
    strat = reg.get("strategy", "atlas_muon:atlas_parallel")
    assert strat.priority > reg.get("strategy", "core:chunkwise").priority
    assert strat.load_params()().checkpoint is True
