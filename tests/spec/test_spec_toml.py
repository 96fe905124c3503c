"""The TOML writer (round trip through tomllib), Spec.to_toml round trip, and the examples."""

from __future__ import annotations

import copy
import math
import tomllib
from pathlib import Path

import pytest

from atlas_core.errors import SpecError
from atlas_core.spec import dump_toml, load_spec

from .toys import VALID, toy_registry

EXAMPLES = sorted((Path(__file__).resolve().parents[2] / "examples").glob("*.toml"))


def test_writer_round_trips_every_value_kind():
    data = {
        "schema": "atlas/1",
        "text": 'quote " backslash \\ newline \n tab \t bell \x07 unicode é ∑',
        "flag": False,
        "n": -12,
        "big": 2**62,
        "x": 1e-06,
        "y": 0.1 + 0.2,
        "z": 3.0,
        "huge": 1.5e300,
        "neg_inf": float("-inf"),
        "section": {
            "plain": "core:l2",
            "dotted.key": 1,
            "knob": {"use": "omega:window", "window": 8, "inner": {"use": "core:l2"}},
            "list": [1, 2, 3],
            "floats": [0.9, 0.95],
            "nested_list": [[1, 2], ["a"]],
            "tables_in_list": [{"a": 1}, {"b": "c"}],
            "empty": {},
            "empty_list": [],
        },
        "empty_section": {},
    }
    text = dump_toml(data)
    assert tomllib.loads(text) == data


def test_writer_nan_and_none():
    back = tomllib.loads(dump_toml({"v": float("nan"), "t": {"a": None, "b": 1}, "gone": None}))
    assert math.isnan(back["v"])
    assert back["t"] == {"b": 1} and "gone" not in back
    assert tomllib.loads(dump_toml({"t": {"a": None}})) == {"t": {}}
    with pytest.raises(TypeError, match=r"t.l\[1\]"):
        dump_toml({"t": {"l": [1, None]}})
    with pytest.raises(TypeError, match="cannot write"):
        dump_toml({"t": {"obj": object()}})


def test_spec_to_toml_round_trip():
    reg = toy_registry()
    data = copy.deepcopy(VALID)
    data["train"] = {"task": {"use": "mqar", "num_pairs": 4}, "steps": 3, "lr": 1e-3, "min_lr": 1e-4}
    spec = load_spec(data, registry=reg)
    text = spec.to_toml()
    assert spec.spec_hash in text.splitlines()[0]
    again = load_spec(text, registry=reg)
    assert again == spec and again.spec_hash == spec.spec_hash
    # every None default (layer.d_key, parallel.backend, train.seq_len) survives as a default
    assert again.layer["d_key"] is None and again.memory["parallel"]["backend"] is None
    assert again.to_dict() == spec.to_dict()


def test_examples_exist():
    names = {p.name for p in EXAMPLES}
    assert {"titans_lmm.toml", "titans_deep_lmm.toml"} <= names


@pytest.mark.parametrize("path", EXAMPLES, ids=[p.stem for p in EXAMPLES])
def test_every_example_validates_and_round_trips(path):
    try:
        spec = load_spec(path)
    except SpecError as exc:
        # an example may need a separately installed plugin (e.g. atlas-miras): then the only
        # problems allowed are components whose namespace is not installed, naming the package
        missing = [i for i in exc.issues if "is not installed" in (i.hint or "")]
        assert missing and len(missing) == len(exc.issues), str(exc)
        pytest.skip(f"{path.name} needs a plugin that is not installed: {missing[0].hint}")
    assert spec.name and spec.arch
    assert load_spec(spec.to_toml()) == spec


def test_titans_examples_mean_what_they_say():
    root = EXAMPLES[0].parent
    lin = load_spec(root / "titans_lmm.toml")
    assert lin.arch == "titans:lmm"
    assert lin.memory["use"] == "titans:titans"
    assert lin.memory["structure"]["use"] == "core:linear"
    assert lin.memory["algorithm"]["use"] == "core:momentum"
    assert lin.memory["retention"]["use"] == "core:decay"
    assert lin.memory["parallel"]["use"] == "core:chunkwise"
    deep = load_spec(root / "titans_deep_lmm.toml")
    assert deep.memory["use"] == "titans:titans_deep"
    assert deep.memory["structure"]["use"] == "titans:mlp" and deep.memory["structure"]["depth"] == 2
    assert deep.spec_hash != lin.spec_hash


@pytest.mark.parametrize("memory,anchor", [
    ('use = "titans:titans_deep"\n', 16),                       # the preset's default
    ('use = "titans:titans"\n', 1),                             # the core default, written out
    ('use = "titans:titans"\nanchor = 32\n', 32),               # written by the user
    ('bias = "core:dot"\nanchor = 8\n', 8),
], ids=["titans_deep-default", "titans-default", "titans-written", "knobs-written"])
def test_spec_show_prints_the_anchor(tmp_path, memory, anchor):
    """The resolved spec (`atlas spec show`, saved beside checkpoints) states the rule's anchor,
    as part of the function; it reads back to the same spec and builds a rule with that anchor."""
    from typer.testing import CliRunner

    from atlas_cli.main import make_app
    from atlas_core.rule import build_rule

    path = tmp_path / "anchored.toml"
    path.write_text('[model]\narch = "core:lm"\nvocab_size = 32\nd_model = 16\n[memory]\n' + memory)
    result = CliRunner().invoke(make_app(), ["spec", "show", str(path)])
    assert result.exit_code == 0, result.output
    shown = tomllib.loads(result.stdout)
    assert shown["memory"]["anchor"] == anchor
    assert f"\nanchor = {anchor}\n" in result.stdout
    spec = load_spec(path)
    assert load_spec(result.stdout) == spec and spec.memory["anchor"] == anchor
    assert build_rule({k: v for k, v in spec.memory.items() if k != "parallel"}).anchor == anchor


def test_anchor_changes_the_spec_hash():
    reg = toy_registry()
    a = load_spec(copy.deepcopy(VALID), registry=reg)
    data = copy.deepcopy(VALID)
    data["memory"]["anchor"] = 8  # another function (chunk 4 still divides it)
    b = load_spec(data, registry=reg)
    assert a.memory["anchor"] == 4 and b.memory["anchor"] == 8
    assert a.spec_hash != b.spec_hash and "anchor = 8" in b.to_toml()
