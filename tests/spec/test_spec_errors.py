"""Bad specs: every problem reported at once, with its dotted path, value and a suggestion."""

from __future__ import annotations

import copy

import pytest

from atlas_core.components import plugin as core_plugin
from atlas_core.errors import SpecError
from atlas_core.host.registry import NamespacedRegistry, Provider, Registry
from atlas_core.spec import SpecFileError, load_spec

from .toys import VALID, toy_registry


@pytest.fixture(scope="module")
def reg():
    return toy_registry()


def errors(data, reg) -> dict[str, object]:
    """{dotted path: Issue} of the SpecError the spec raises."""
    with pytest.raises(SpecError) as info:
        load_spec(data, registry=reg)
    return {i.path: i for i in info.value.issues}


def variant(**changes):
    data = copy.deepcopy(VALID)
    for dotted, value in changes.items():
        *head, last = dotted.split("__")
        table = data
        for key in head:
            table = table[key]
        table[last] = value
    return data


def test_unknown_keys_everywhere_with_did_you_mean(reg):
    data = variant(nmae="x", model__vocab_szie=3, memory__algoritm="core:gd", layer__qk_nrom=True)
    found = errors(data, reg)
    assert set(found) == {"nmae", "model.vocab_szie", "memory.algoritm", "layer.qk_nrom"}
    assert "'name'" in found["nmae"].hint
    assert "'vocab_size'" in found["model.vocab_szie"].hint
    assert "'algorithm'" in found["memory.algoritm"].hint
    assert "'qk_norm'" in found["layer.qk_nrom"].hint


def test_unknown_component_names_suggest_the_near_miss(reg):
    data = variant(model__arch="toy:lmm", memory__structure="core:linaer",
                   memory__parallel={"use": "core:chunkwse"})
    found = errors(data, reg)
    assert set(found) == {"model.arch", "memory.structure", "memory.parallel.use"}
    assert found["model.arch"].value == "toy:lmm" and "'toy:lm'" in found["model.arch"].hint
    assert "'core:linear'" in found["memory.structure"].hint
    assert "'core:chunkwise'" in found["memory.parallel.use"].hint


def test_wrong_types_and_out_of_range_values(reg):
    data = variant(model__d_model="big", model__depth=0, memory__parallel={"use": "core:chunkwise", "chunk_size": 0},
                   layer__conv_size=-1, memory__read="middle", name=3)
    found = errors(data, reg)
    assert set(found) == {"name", "model.d_model", "model.depth", "memory.parallel.chunk_size",
                          "layer.conv_size", "memory.read"}
    assert found["model.d_model"].value == "big"
    assert found["model.depth"].value == 0 and "greater than or equal to 1" in found["model.depth"].message
    assert found["memory.parallel.chunk_size"].value == 0
    assert found["memory.read"].value == "middle"


def test_missing_plugin_namespace_names_the_distribution(reg):
    data = variant(memory__retention="miras:yaad", memory__bias={"use": "nowhere:thing"})
    found = errors(data, reg)
    assert "atlas-miras" in found["memory.retention"].hint  # a known distribution
    assert "namespace 'nowhere'" in found["memory.bias.use"].hint


def test_unknown_arch_when_no_arch_is_registered():
    bare = Registry()
    core_plugin.atlas_register(registry=NamespacedRegistry(bare, Provider("core", "atlas-ttm", "0", "core")))
    data = variant(model__arch="titans:lmm", memory={"algorithm": "core:momentum"})
    found = errors(data, bare)
    assert set(found) == {"model.arch"}
    assert "titans" in found["model.arch"].hint and "not installed" in found["model.arch"].hint
    found = errors({**data, "model": {"arch": "lmm"}}, bare)
    assert "atlas components list arch" in found["model.arch"].hint


def test_wrong_schema_and_missing_sections(reg):
    found = errors({"schema": "atlas/2", "layer": 3}, reg)
    assert set(found) == {"schema", "model", "memory", "layer"}
    assert "'atlas/1'" in found["schema"].message and found["schema"].value == "atlas/2"
    found = errors({"model": {"vocab_size": 3}, "memory": "nope:x"}, reg)
    assert set(found) == {"model.arch", "memory.use"}


def test_knob_params_and_tables_without_use(reg):
    data = variant(memory__bias={"use": "core:l2", "scale": 2}, memory__structure={"depth": 2})
    found = errors(data, reg)
    assert "takes no parameters" in found["memory.bias"].message
    assert "'use'" in found["memory.structure"].message


def test_several_errors_are_reported_together_in_one_message(reg):
    data = variant(schema="atlas/0", model__arch="toy:lmm", memory__retention="core:decya",
                   layer__conv_size="x")
    with pytest.raises(SpecError) as info:
        load_spec(data, registry=reg)
    text = str(info.value)
    assert text.startswith("4 problems:")
    for path in ("schema:", "model.arch:", "memory.retention:", "layer.conv_size:"):
        assert path in text


def test_toml_syntax_error_names_file_line_and_column(tmp_path, reg):
    path = tmp_path / "broken.toml"
    path.write_text('schema = "atlas/1"\nname = "x"\n[model\narch = "toy:lm"\n')
    with pytest.raises(SpecFileError) as info:
        load_spec(path, registry=reg)
    err = info.value
    assert err.line == 3 and err.file == str(path)
    assert str(err).startswith(f"{path}:3:") and "invalid TOML" in str(err)
    with pytest.raises(SpecFileError) as info:
        load_spec('name = "x"\nname = "y"\n', registry=reg)
    assert info.value.line == 2 and str(info.value).startswith("<string>:2:")


def test_missing_file_and_bad_source_type(tmp_path, reg):
    with pytest.raises(SpecFileError) as info:
        load_spec(tmp_path / "nope.toml", registry=reg)
    assert "no such file" in str(info.value) and "nope.toml" in str(info.value)
    with pytest.raises(TypeError, match="path, TOML text, a dict or a Spec"):
        load_spec(42, registry=reg)


def test_unknown_key_in_a_nested_table_suggests_from_that_table(reg):
    found = errors(variant(layer__gate_bias={"alfa": 1.0, "theta": "x"}), reg)
    assert set(found) == {"layer.gate_bias.alfa", "layer.gate_bias.theta"}
    assert found["layer.gate_bias.alfa"].hint == "did you mean 'alpha'?"
    assert found["layer.gate_bias.theta"].value == "x"
