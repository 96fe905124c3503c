"""Spec overrides: ``KEY.PATH=VALUE`` parsing and application (atlas_core.spec.overrides), and the
commands that take them (train, build, spec show|validate, compare) with the common flags."""

from __future__ import annotations

import json
import tomllib

import pytest
from typer.testing import CliRunner

from atlas_cli.main import make_app
from atlas_core.errors import Issue, SpecError
from atlas_core.spec import dump_toml, load_spec
from atlas_core.spec.overrides import (
    Override, annotate, apply_overrides, flag_overrides, from_mapping, load_with_overrides,
    parse_override, parse_overrides, parse_value, split_args,
)
from tests.train.conftest import TINY

runner = CliRunner()
EXAMPLE = "examples/titans_lmm.toml"


def invoke(args):
    return runner.invoke(make_app(plugin_apps=False), [str(a) for a in args])


@pytest.fixture
def tiny_file(tmp_path):
    path = tmp_path / "tiny.toml"
    path.write_text(dump_toml(TINY))
    return path


# -- parsing ------------------------------------------------------------------------------------
@pytest.mark.parametrize("text, value", [
    ("64", 64), ("1e-3", 0.001), ("-2", -2), ("true", True), ("false", False),
    ('"core:l2"', "core:l2"), ("core:l2", "core:l2"), ("[1, 2]", [1, 2]), ("[0.9,0.99]", [0.9, 0.99]),
    ("{use = 'mqar', num_pairs = 4}", {"use": "mqar", "num_pairs": 4}), ("hello world", "hello world"),
    ("'quoted'", "quoted"), ("inf", float("inf")), ("", ""), ("01", "01"),
])
def test_values_are_toml_literals_else_strings(text, value):
    assert parse_value(text) == value
    assert type(parse_value(text)) is type(value)


def test_parse_override_keeps_its_text_and_splits_at_the_first_equals():
    ov = parse_override("layer.gate_bias.alpha=3.5")
    assert ov.path == ("layer", "gate_bias", "alpha") and ov.value == 3.5
    assert str(ov) == "layer.gate_bias.alpha=3.5" and ov.key == "layer.gate_bias.alpha"
    assert parse_override("name=a=b").value == "a=b"


def test_malformed_overrides_are_reported_together():
    with pytest.raises(SpecError) as info:
        parse_overrides(["model..d_model=1", "novalue", "ok.key=1", "a b=1"])
    text = str(info.value)
    assert "3 problems" in text
    assert "'model..d_model=1'" in text and "'novalue'" in text and "'a b=1'" in text
    assert "KEY.PATH=VALUE" in text


def test_split_args_tells_files_from_overrides(tmp_path):
    odd = tmp_path / "a=b"  # an existing file whose name looks like an override stays a file
    odd.write_text("")
    files, texts = split_args(["spec.toml", "model.d_model=64", str(odd), "x=1.toml", "lr=1"])
    assert files == ["spec.toml", str(odd), "x=1.toml"]
    assert texts == ["model.d_model=64", "lr=1"]


def test_flag_overrides_name_the_flag():
    ovs = flag_overrides(lr=1e-3, steps=None, batch_size=8, seq_len=32, seed=1, device="cpu")
    assert [o.key for o in ovs] == ["train.lr", "train.batch_size", "train.seq_len", "train.seed",
                                    "train.device"]
    assert str(ovs[0]) == "--lr 0.001" and str(ovs[1]) == "--batch-size 8"
    with pytest.raises(TypeError, match="no common flag 'warmup'"):
        flag_overrides(warmup=3)


def test_from_mapping_takes_dotted_keys_and_section_tables():
    a = from_mapping({"model.d_model": 64, "train": {"lr": 1e-3, "task": {"use": "copy"}},
                      "train.task": {"use": "mqar"}, "name": "x", "layer": {}})
    assert [(o.key, o.value) for o in a] == [
        ("model.d_model", 64), ("train.lr", 1e-3), ("train.task", {"use": "copy"}),
        ("train.task", {"use": "mqar"}), ("name", "x"), ("layer", {})]
    # a table value replaces the table at its path (as `train.task={use = "copy"}` does)
    data = {"train": {"task": {"use": "mqar", "num_pairs": 2}, "lr": 0.1}}
    out = apply_overrides(data, from_mapping({"train": {"task": {"use": "copy"}}}))
    assert out == {"train": {"task": {"use": "copy"}, "lr": 0.1}}


# -- applying -----------------------------------------------------------------------------------
def test_apply_sets_creates_expands_and_does_not_touch_the_input():
    data = {"model": {"d_model": 8}, "memory": {"bias": "core:l2", "anchor": 4}}
    out = apply_overrides(data, parse_overrides([
        "model.d_model=16", "train.lr=1e-3", "memory.bias.scale=2", "model.d_model=32"]))
    assert out["model"]["d_model"] == 32  # the later override of a path wins
    assert out["train"] == {"lr": 1e-3}  # a missing table is created
    assert out["memory"]["bias"] == {"use": "core:l2", "scale": 2}  # a name is its table's `use`
    assert data == {"model": {"d_model": 8}, "memory": {"bias": "core:l2", "anchor": 4}}


def test_a_path_through_a_value_is_an_error_at_that_value():
    with pytest.raises(SpecError) as info:
        apply_overrides({"model": {"d_model": 8}}, [parse_override("model.d_model.x=1")])
    (issue,) = info.value.issues
    assert issue.path == "model.d_model" and issue.value == 8
    assert "not a table" in issue.message


def test_resolved_like_a_file_with_the_override_named():
    spec = load_with_overrides(EXAMPLE, parse_overrides(
        ["model.d_model=64", "train.lr=1e-3", "memory.parallel.chunk_size=16"]))
    assert spec.model["d_model"] == 64 and spec.train["lr"] == 1e-3
    assert spec.memory["parallel"]["chunk_size"] == 16
    assert spec.name == "titans-lmm-small" and spec.source == EXAMPLE
    # the same spec as the file edited by hand
    raw = tomllib.loads(open(EXAMPLE).read())
    raw["model"]["d_model"] = 64
    raw["train"]["lr"] = 1e-3
    raw["memory"]["parallel"]["chunk_size"] = 16
    assert spec == load_spec(raw)
    with pytest.raises(SpecError) as info:
        load_with_overrides(EXAMPLE, parse_overrides(["model.d_modle=64", "train.lrr=1"]))
    issues = {i.path: i for i in info.value.issues}
    assert set(issues) == {"model.d_modle", "train.lrr"}
    assert "did you mean 'd_model'" in issues["model.d_modle"].hint
    assert "set by the override model.d_modle=64" in issues["model.d_modle"].hint
    assert "did you mean 'lr'" in issues["train.lrr"].hint
    assert str(info.value).startswith(f"{EXAMPLE} with model.d_modle=64 train.lrr=1:")


def test_a_problem_the_override_causes_elsewhere_names_it_in_the_source():
    # anchor 16 with the example's chunk_size 64: the error is at memory.parallel
    with pytest.raises(SpecError) as info:
        load_with_overrides(EXAMPLE, parse_overrides(["memory.anchor=16"]))
    assert info.value.issues[0].path == "memory.parallel"
    assert "with memory.anchor=16" in str(info.value)


def test_annotate_matches_paths_inside_and_around():
    err = SpecError([Issue("train", "min_lr above lr"), Issue("model.depth", "bad")])
    out = annotate(err, [Override(("train", "lr"), 1e-5, "--lr 1e-05")], "f.toml")
    assert "set by the override --lr 1e-05" in out.issues[0].hint
    assert out.issues[1].hint is None
    assert out.source == "f.toml with --lr 1e-05"


# -- commands -----------------------------------------------------------------------------------
def test_train_saves_the_overrides_in_the_resolved_spec(tiny_file, tmp_path):
    out = tmp_path / "run"
    r = invoke(["--format", "json", "train", tiny_file, "model.d_model=8", "train.lr=1e-3",
                "layer.gate_bias.theta=-1.0", "--steps", 2, "--batch-size", 2, "--seed", 3,
                "--out", out, "--no-progress"])
    assert r.exit_code == 0, r.output
    assert json.loads(r.stdout)["steps"] == 2
    saved = tomllib.loads((out / "spec.toml").read_text())
    assert saved["model"]["d_model"] == 8
    assert saved["train"]["lr"] == 1e-3 and saved["train"]["steps"] == 2
    assert saved["train"]["batch_size"] == 2 and saved["train"]["seed"] == 3
    assert saved["layer"]["gate_bias"]["theta"] == -1.0
    assert saved["model"]["depth"] == TINY["model"]["depth"]  # the rest is the file's


def test_train_the_example_with_overrides_and_flags(tmp_path):
    """`atlas train examples/titans_lmm.toml model.d_model=64 train.lr=1e-3 --steps N` (with the
    batch and length made small so that it takes seconds)."""
    out = tmp_path / "titans"
    r = invoke(["train", EXAMPLE, "model.d_model=64", "train.lr=1e-3", "--steps", 2,
                "--batch-size", 2, "--seq-len", 32, "train.eval_batches=1", "--device", "cpu",
                "--out", out, "--no-progress"])
    assert r.exit_code == 0, r.output
    saved = tomllib.loads((out / "spec.toml").read_text())
    assert saved["model"]["d_model"] == 64 and saved["train"]["lr"] == 1e-3
    assert saved["train"]["steps"] == 2 and saved["train"]["seq_len"] == 32


def test_a_flag_wins_over_a_word_for_the_same_key(tiny_file):
    r = invoke(["--format", "json", "spec", "show", tiny_file, "train.lr=0.5"])
    assert r.exit_code == 0 and json.loads(r.stdout)["train"]["lr"] == 0.5
    spec = load_with_overrides(tiny_file, parse_overrides(["train.lr=0.5"]) + flag_overrides(lr=0.25))
    assert spec.train["lr"] == 0.25


def test_train_bad_override_is_one_line_naming_it(tiny_file, tmp_path):
    out = tmp_path / "never"
    r = invoke(["train", tiny_file, "model.d_modle=8", "--lr", "1e-6", "--out", out])
    assert r.exit_code == 1
    assert r.stdout == "" and "Traceback" not in r.output
    assert "model.d_modle: unknown key (got 8); did you mean 'd_model'?; set by the override " \
           "model.d_modle=8" in r.stderr
    assert "set by the override --lr 1e-06" in r.stderr
    assert not out.exists()  # nothing was written


def test_two_specs_for_train_is_a_usage_error(tiny_file):
    r = invoke(["train", tiny_file, tiny_file])
    assert r.exit_code == 2 and "KEY.PATH=VALUE" in r.output


def test_build_and_spec_show_take_overrides(tiny_file):
    base = json.loads(invoke(["--format", "json", "build", tiny_file, "--device", "meta"]).stdout)
    r = invoke(["--format", "json", "build", tiny_file, "model.d_model=32", "--device", "meta"])
    assert r.exit_code == 0, r.output
    big = json.loads(r.stdout)
    assert big["total_params"] > base["total_params"]
    shown = json.loads(invoke(["--format", "json", "spec", "show", tiny_file, "model.depth=3"]).stdout)
    assert shown["model"]["depth"] == 3
    toml_text = invoke(["spec", "show", tiny_file, "model.depth=3"]).stdout
    assert tomllib.loads(toml_text)["model"]["depth"] == 3


def test_spec_validate_applies_overrides_to_every_file(tiny_file):
    rows = json.loads(invoke(["--format", "json", "spec", "validate", tiny_file, tiny_file,
                              "model.heads=two"]).stdout)
    assert len(rows) == 2
    for row in rows:
        assert not row["ok"] and row["errors"][0]["path"] == "model.heads"
        assert "set by the override model.heads=two" in row["errors"][0]["hint"]
    # a problem found when the model is built (16 is not divisible by 3 heads)
    (row,) = json.loads(invoke(["--format", "json", "spec", "validate", tiny_file,
                                "model.heads=3"]).stdout)
    assert not row["ok"] and "heads=3" in row["errors"][0]["message"]
    ok = invoke(["spec", "validate", tiny_file, "model.heads=4"])
    assert ok.exit_code == 0, ok.output


def test_compare_applies_overrides_to_every_spec(tiny_file, tmp_path):
    other = tmp_path / "other.toml"
    data = dict(TINY, name="other")
    other.write_text(dump_toml(data))
    out = tmp_path / "runs"
    r = invoke(["--format", "json", "compare", tiny_file, other, "model.d_model=8", "--steps", 1,
                "--batch-size", 2, "--lr", "1e-3", "train.eval_batches=1", "--out", out])
    assert r.exit_code == 0, r.output
    rows = json.loads(r.stdout)
    assert [row["steps"] for row in rows] == [1, 1]
    for row in rows:
        saved = tomllib.loads((out.glob(f"*-{row['name']}").__next__() / "spec.toml").read_text())
        assert saved["model"]["d_model"] == 8 and saved["train"]["lr"] == 1e-3
        assert saved["train"]["batch_size"] == 2
