"""The resolved spec is the only input to a build: resolution builds the rule once, decides the
strategy once (auto's choice and every ``supports()`` it asks) and writes the preset's layer
defaults into ``[layer]``; building the model's layers then makes no registry look-up and no
``supports()`` call. Counted on real builds by wrapping the registry and the strategies."""

from __future__ import annotations

import collections
import copy
import json
import pickle
from pathlib import Path

import pytest
import torch
from typer.testing import CliRunner

import atlas_core as ac
import atlas_core.rule_build as rule_build
from atlas_core.host.manager import get_registry
from atlas_core.host.registry import Registry
from atlas_core.layer import MemoryRecipe
from atlas_core.spec import load_spec
from atlas_core.spec.compat import content_hash
from atlas_core.strategies.base import auto_strategy
from atlas_core.train.setup import default_spec_text
from atlas_cli.main import make_app

EXAMPLES = sorted((Path(__file__).resolve().parents[2] / "examples").glob("*.toml"))
#: the fields a preset may declare a default for, which resolution fills
PRESET_FIELDS = ("output_gate", "output_gate_bias", "conv_init", "q_scale")


@pytest.fixture
def counts(monkeypatch):
    """``(what, phase) -> calls``: registry look-ups (``get``, ``build``) and ``supports()`` calls
    (counted once where the strategy's own class defines it, whatever ``super()`` does), with
    phase ``"layer"`` while `MemoryRecipe.layer` builds a layer, else ``"other"``; ``("layers",
    "built")`` counts the layers."""
    counter: collections.Counter = collections.Counter()
    phase = ["other"]
    for name in ("get", "build"):
        real = getattr(Registry, name)

        def counting(self, *a, _real=real, _name=name, **k):
            counter[(_name, phase[0])] += 1
            return _real(self, *a, **k)

        monkeypatch.setattr(Registry, name, counting)
    reg = get_registry()
    classes = {type(reg.build("strategy", comp.name)) for comp in reg.all("strategy")}
    for cls in {c for k in classes for c in k.__mro__ if "supports" in c.__dict__}:
        real = cls.__dict__["supports"]

        def supports(self, rule, *a, _real=real, _cls=cls, **k):
            if next(c for c in type(self).__mro__ if "supports" in c.__dict__) is _cls:
                counter[("supports", phase[0])] += 1
            return _real(self, rule, *a, **k)

        monkeypatch.setattr(cls, "supports", supports)
    real_layer = MemoryRecipe.layer

    def layer(self, *a, **k):
        phase[0] = "layer"
        counter[("layers", "built")] += 1
        try:
            return real_layer(self, *a, **k)
        finally:
            phase[0] = "other"

    monkeypatch.setattr(MemoryRecipe, "layer", layer)
    counter.clear()
    return counter


def test_a_fresh_train_decides_the_strategy_once_per_memory_spec(tmp_path, counts):
    load_spec(default_spec_text())
    asked = counts[("supports", "other")]  # what resolving the default spec's [memory] asks
    assert asked >= 1
    counts.clear()
    r = CliRunner().invoke(make_app(plugin_apps=False),
                           ["--format", "json", "train", "--steps", "1", "--out", str(tmp_path / "run"),
                            "--no-progress"], catch_exceptions=False)
    assert r.exit_code == 0, r.output
    assert counts[("layers", "built")] == 2  # the default model: two memory layers
    assert counts[("supports", "other")] == asked  # once for the memory spec, not per layer
    assert counts[("supports", "layer")] == 0
    assert counts[("get", "layer")] == counts[("build", "layer")] == 0  # no look-up in a layer


def test_the_model_of_a_resolved_spec_copies_its_rule(counts):
    spec = load_spec(EXAMPLES[0])  # atlas_lmm: a deep memory, atlas_muon:atlas_parallel
    counts.clear()
    model = ac.build_model(spec)
    layers = [m for m in model.modules() if hasattr(m, "runner") and hasattr(m, "gate_proj")]
    assert len(layers) >= 2 and counts[("supports", "other")] == counts[("supports", "layer")] == 0
    assert counts[("get", "layer")] == counts[("build", "layer")] == 0
    assert {id(m.runner) for m in layers} == {id(spec.memory_plan.strategy)}
    assert len({id(m.rule) for m in layers}) == len(layers)  # each layer its own rule
    assert all(m.rule is not spec.memory_plan.rule for m in layers)


def test_the_gate_bias_check_uses_the_rule_resolution_built(monkeypatch):
    built = []
    real = rule_build.build_rule

    def counting(*a, **k):
        built.append(a)
        return real(*a, **k)

    monkeypatch.setattr(rule_build, "build_rule", counting)
    monkeypatch.setattr("atlas_core.rule.build_rule", counting)
    spec = load_spec({"model": {"arch": "core:lm", "vocab_size": 16, "d_model": 16, "heads": 2},
                      "memory": {"use": "zoo:rwkv7"}, "layer": {"gate_bias": {"kappa": 0.5}}})
    assert spec.layer["gate_bias"] == {"kappa": 0.5} and len(built) == 1


@pytest.mark.parametrize("path", EXAMPLES, ids=lambda p: p.stem)
def test_resolve_show_resolve_keeps_the_spec_and_its_hash(path):
    spec = load_spec(path)
    again = load_spec(spec.to_toml())  # what `atlas spec show` prints, resolved again
    assert again == spec and again.spec_hash == spec.spec_hash
    assert load_spec(json.loads(json.dumps(spec.to_dict()))).spec_hash == spec.spec_hash
    assert all(spec.layer[key] is not None for key in PRESET_FIELDS)  # every value shown


def test_the_preset_layer_defaults_are_in_the_resolved_spec():
    spec = load_spec({"model": {"arch": "core:lm", "vocab_size": 16, "d_model": 16, "heads": 2},
                      "memory": {"use": "zoo:deltanet"}, "layer": {"gate_form": {"theta": "declared"}}})
    assert {k: spec.layer[k] for k in (*PRESET_FIELDS, "gate_form")} == {
        "output_gate": "none", "output_gate_bias": True, "conv_init": "normal", "q_scale": "rsqrt_d_key",
        "gate_form": {"theta": "declared"}}  # the spec's entry over the preset's
    core = load_spec({"model": {"arch": "core:lm", "vocab_size": 16, "d_model": 16, "heads": 2},
                      "memory": {"use": "zoo:gated_deltanet"}})
    assert {k: core.layer[k] for k in PRESET_FIELDS} == {
        "output_gate": "sigmoid", "output_gate_bias": True, "conv_init": "identity", "q_scale": 1.0}


def test_an_export_stating_none_for_a_layer_default_loads():
    """An earlier version's export holds None where the preset's default was left to the build."""
    from atlas_core.hf.config import AtlasConfig

    spec = load_spec({"model": {"arch": "core:lm", "vocab_size": 16, "d_model": 8, "heads": 2},
                      "memory": {"use": "zoo:deltanet"}})
    stored = spec.to_dict()
    stored["layer"].update({key: None for key in PRESET_FIELDS})
    config = AtlasConfig(atlas_spec=stored, atlas_spec_hash=content_hash(stored))
    assert config.spec() == spec


def test_a_rule_holding_tensors_is_built_anew_on_another_device():
    """A learned feature map's coefficients are made when the rule is built: a build on the meta
    device does not copy the resolution's (CPU) rule."""
    spec = load_spec(EXAMPLES[0])
    assert spec.memory_plan.holds_tensors
    with torch.device("meta"):
        model = ac.build_model(spec)
    assert {p.device.type for p in model.parameters()} == {"meta"}


def test_a_copied_spec_shares_its_plan_and_a_pickled_one_builds_the_same_model():
    spec = load_spec(EXAMPLES[-1])
    assert copy.deepcopy(spec).memory_plan is spec.memory_plan
    thawed = pickle.loads(pickle.dumps(spec))
    assert thawed == spec and thawed.memory_plan is None
    torch.manual_seed(0)
    a = ac.build_model(spec).state_dict()
    torch.manual_seed(0)
    b = ac.build_model(thawed).state_dict()
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


def test_build_rule_runs_auto_unless_told():
    """A rule built without ``parallel`` runs what a model of its spec runs ("auto"); the
    reference loop is one argument away, and both compute the same function."""
    memory = {"use": "atlas_muon:atlas_linear"}
    rule = ac.build_rule(memory, heads=2, d_key=8, d_value=8).double()
    chosen = auto_strategy(ac.build_rule(memory)).name
    assert rule_build.DEFAULT_STRATEGY == "auto" and rule.default_strategy == "auto"
    assert rule.runner().name == chosen == load_spec(
        {"model": {"arch": "core:lm", "vocab_size": 16, "d_model": 16, "heads": 2},
         "memory": memory}).memory["parallel"]["use"]
    assert chosen != "core:sequential"
    loop = ac.build_rule({**memory, "parallel": "core:sequential"}, heads=2, d_key=8, d_value=8).double()
    assert loop.runner().name == "core:sequential"
    torch.manual_seed(0)
    B, T, H, D = 1, 16, 2, 8
    q, k, v = (torch.randn(B, T, H, D, dtype=torch.float64) for _ in range(3))
    k = torch.nn.functional.normalize(k, dim=-1)
    gates = {name: torch.rand(B, T, H, dtype=torch.float64) * 0.5 + 0.25 for name in rule.gate_names}
    y, state = rule(q, k, v, gates=gates)
    y_ref, state_ref = loop(q, k, v, gates=gates)
    torch.testing.assert_close(y, y_ref)
    for key in state_ref:
        torch.testing.assert_close(state[key], state_ref[key])
