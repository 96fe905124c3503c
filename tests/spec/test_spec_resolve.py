"""Spec resolution: defaults filled, names canonical, presets expanded, strategies checked."""

from __future__ import annotations

import copy

import pytest
from pydantic import ValidationError

from atlas_core.errors import SpecError
from atlas_core.layer import LayerParams
from atlas_core.spec import SCHEMA, Spec, load_spec, resolve_spec

from .toys import VALID, toy_registry


@pytest.fixture(scope="module")
def reg():
    return toy_registry()


def spec_with(reg, **sections):
    data = copy.deepcopy(VALID)
    for key, value in sections.items():
        if value is None:
            data.pop(key, None)
        else:
            data[key] = value
    return load_spec(data, registry=reg)


def test_valid_spec_fills_every_default(reg):
    spec = load_spec(copy.deepcopy(VALID), registry=reg)
    assert spec.schema_id == SCHEMA and spec.name == "toy-small"
    # [model]: written keys kept, the arch's defaults filled
    assert spec.model == {"arch": "toy:lm", "vocab_size": 16, "d_model": 8, "depth": 1,
                          "heads": 2, "tie": False, "dropout": 0.0}
    # [memory]: the preset is kept first, every knob written out as {use = ...}
    assert list(spec.memory) == ["use", "structure", "bias", "retention", "algorithm",
                                 "feature_map", "read", "anchor", "parallel"]
    assert spec.memory["use"] == "toy:delta"
    assert spec.memory["structure"] == {"use": "core:linear"}  # core default
    assert spec.memory["algorithm"] == {"use": "core:gd"}  # from the preset
    assert spec.memory["retention"] == {"use": "core:decay"}  # the spec's override
    assert spec.memory["read"] == "after"
    assert spec.memory["anchor"] == 4  # written; chunkwise's chunk_size 4 divides it
    assert spec.memory["parallel"] == {"use": "core:chunkwise", "chunk_size": 4, "backend": None,
                                      "checkpoint": None, "memory_budget_mib": 1024.0}
    # [layer]: every LayerParams field present, the written one kept
    assert set(spec.layer) == set(LayerParams.model_fields)
    assert spec.layer["conv_size"] == 2 and spec.layer["qk_norm"] is True
    assert spec.train is None


def test_short_names_become_full_names(reg):
    spec = spec_with(reg, memory={"bias": "dot", "parallel": "sequential"})
    assert spec.memory["bias"] == {"use": "core:dot"}
    assert spec.memory["parallel"] == {"use": "core:sequential"}
    assert spec.memory["anchor"] == 1  # the default is written out: the per-token rule
    assert "use" not in spec.memory  # no preset named, none invented
    # a short name two namespaces provide (core:lm and toy:lm) is an error naming both
    with pytest.raises(SpecError) as info:
        spec_with(reg, model={"arch": "lm"})
    (issue,) = info.value.issues
    assert issue.path == "model.arch" and "'core:lm'" in str(info.value) and "'toy:lm'" in str(info.value)


def test_parallel_defaults_to_auto_and_auto_is_resolved(reg):
    spec = spec_with(reg, memory={"algorithm": "core:momentum"})
    seq = spec_with(reg, memory={"algorithm": "core:momentum", "parallel": "core:sequential"})
    assert seq.memory["parallel"] == {"use": "core:sequential"}
    auto = spec_with(reg, memory={"algorithm": "core:momentum", "parallel": "auto"})
    # the per-token rule (anchor 1): core:chunkwise (priority 10) refuses it, core:exact_chunk
    # (priority 5) runs it exactly; auto picks it, with its defaults
    assert auto.memory["parallel"] == {"use": "core:exact_chunk", "chunk_size": 32}
    assert spec.memory["parallel"] == auto.memory["parallel"]
    # the anchored rule: core:chunkwise runs it, its chunk left to the anchor's largest divisor
    anchored = spec_with(reg, memory={"algorithm": "core:momentum", "anchor": 16})
    assert anchored.memory["parallel"] == {"use": "core:chunkwise", "chunk_size": None,
                                          "backend": None, "checkpoint": None,
                                          "memory_budget_mib": 1024.0}
    # a memory-free bias (core:dot) at anchor 1: core:chunkwise runs it at any chunk
    dot = spec_with(reg, memory={"bias": "core:dot"})
    assert dot.memory["anchor"] == 1 and dot.memory["parallel"]["use"] == "core:chunkwise"


def test_a_strategy_that_refuses_the_rule_is_an_error_with_its_reason(reg):
    with pytest.raises(SpecError) as info:
        spec_with(reg, memory={"parallel": "toy:picky"})
    issues = info.value.issues
    assert [i.path for i in issues] == ["memory.parallel"]
    assert "needs a rule with a toy capability" in issues[0].message


def test_per_token_rule_refuses_chunks_above_one_with_the_anchor_as_reason(reg):
    with pytest.raises(SpecError) as info:
        spec_with(reg, memory={"use": "toy:delta", "parallel": {"use": "core:chunkwise", "chunk_size": 4}})
    (issue,) = info.value.issues
    assert issue.path == "memory.parallel"
    assert "anchor = 1" in issue.message and "anchor = 4" in issue.message
    with pytest.raises(SpecError) as info:
        spec_with(reg, memory={"use": "toy:delta", "anchor": 6,
                               "parallel": {"use": "core:chunkwise", "chunk_size": 4}})
    assert [i.path for i in info.value.issues] == ["memory.parallel"]
    assert "does not divide the rule's anchor=6" in info.value.issues[0].message
    # chunk 1 is always the per-token rule itself
    one = spec_with(reg, memory={"use": "toy:delta", "parallel": {"use": "core:chunkwise", "chunk_size": 1}})
    assert one.memory["anchor"] == 1 and one.memory["parallel"]["chunk_size"] == 1


@pytest.mark.parametrize("bad", [0, -1, 2.5, True, "16", 10**12])
def test_bad_anchor_is_one_error_at_memory_anchor(reg, bad):
    with pytest.raises(SpecError) as info:
        spec_with(reg, memory={"use": "toy:delta", "anchor": bad, "parallel": "core:sequential"})
    assert [i.path for i in info.value.issues] == ["memory.anchor"], str(info.value)


def test_standalone_rule_refuses_an_anchor(reg):
    with pytest.raises(SpecError) as info:
        spec_with(reg, memory={"use": "toy:solo", "anchor": 8})
    (issue,) = info.value.issues
    assert issue.path == "memory.anchor" and "standalone" in issue.message


def test_standalone_rule_params_filled_and_chunkwise_refused(reg):
    spec = spec_with(reg, memory={"use": "toy:solo", "scale": 2.5})
    assert spec.memory == {"use": "toy:solo", "scale": 2.5, "flag": False,
                           "parallel": {"use": "core:sequential"}}
    with pytest.raises(SpecError) as info:
        spec_with(reg, memory={"use": "toy:solo", "parallel": "core:chunkwise"})
    assert info.value.issues[0].path == "memory.parallel"
    assert "standalone" in info.value.issues[0].message


def test_resolution_is_idempotent_and_name_defaults(reg, tmp_path):
    spec = load_spec(copy.deepcopy(VALID), registry=reg)
    assert load_spec(spec.to_dict(), registry=reg) == spec
    assert load_spec(spec, registry=reg) is spec
    data = copy.deepcopy(VALID)
    del data["name"], data["schema"]
    assert resolve_spec(data, registry=reg).name == "unnamed"
    path = tmp_path / "my_model.toml"
    path.write_text('[model]\narch = "toy:lm"\n[memory]\n')
    from_file = load_spec(path, registry=reg)
    assert from_file.name == "my_model" and from_file.source == str(path)
    assert from_file.schema_id == SCHEMA


def test_spec_hash_is_stable_and_content_sensitive(reg):
    a = load_spec(copy.deepcopy(VALID), registry=reg)
    reordered = {k: VALID[k] for k in reversed(list(VALID))}
    reordered["model"] = dict(reversed(list(VALID["model"].items())))
    b = load_spec(reordered, registry=reg)
    assert a.spec_hash == b.spec_hash and a == b and hash(a) == hash(b)
    assert len(a.spec_hash) == 16 and int(a.spec_hash, 16) >= 0
    c = spec_with(reg, model={**VALID["model"], "depth": 2})
    assert c.spec_hash != a.spec_hash and c != a


def test_train_table_is_validated_by_the_trainer(reg):
    spec = spec_with(reg, train={"task": "mqar", "steps": 5})
    assert spec.train["steps"] == 5
    assert spec.train["task"]["use"] == "core:mqar"
    with pytest.raises(SpecError) as info:
        spec_with(reg, train={"steps": 0, "stpes": 3})
    paths = {i.path for i in info.value.issues}
    assert paths == {"train.steps", "train.stpes"}


def test_spec_object_is_frozen(reg):
    spec = load_spec(copy.deepcopy(VALID), registry=reg)
    assert isinstance(spec, Spec)
    with pytest.raises(ValidationError):
        spec.name = "other"


def test_a_path_with_equals_sign_is_a_path(reg, tmp_path):
    folder = tmp_path / "lr=3e-3"
    folder.mkdir()
    path = folder / "spec.toml"
    path.write_text('[model]\narch = "toy:lm"\n[memory]\nbias = "core:dot"\n')
    assert load_spec(str(path), registry=reg).memory["bias"] == {"use": "core:dot"}
