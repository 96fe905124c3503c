"""`atlas spec validate` runs the `[train]` task's own checks in the same pass as the model's, so
a text spec that `atlas train` refuses is refused by validation too, with the message training
gives: a missing or empty corpus, byte mode with fewer than 256 ids, a sequence length longer
than the text."""

from __future__ import annotations

import contextlib
import json
import shutil

import pytest
from typer.testing import CliRunner

from atlas_cli.main import make_app
from atlas_core.example_specs import examples_dir

SPEC = """schema = "atlas/1"
name = "bad"
[model]
arch = "core:lm"
vocab_size = 64
d_model = 16
depth = 1
heads = 2
[memory]
structure = "core:linear"
bias = "core:l2"
retention = "core:none"
algorithm = "core:gd"
[train]
task = {TASK}
steps = 2
"""

CASES = {
    "missing file": ('{ use = "text", path = "nowhere.txt" }', [], "no such file 'nowhere.txt'"),
    "empty file": ('{ use = "text", path = "empty.txt" }', [], "'empty.txt' is empty"),
    "byte mode, 64 ids": ('{ use = "text", path = "examples/text_char.txt", mode = "byte" }', [],
                          "uses 256 token ids, the model has 64"),
    "seq_len past the text": (None, ["train.seq_len=100000"], "seq_len=100000 needs at least"),
}


def run(args):
    r = CliRunner().invoke(make_app(plugin_apps=False), args)
    return r.exit_code, r.stdout, r.stderr


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    root = tmp_path_factory.mktemp("validate")
    (root / "examples").mkdir()
    for name in ("text_char.toml", "text_char.txt"):
        shutil.copyfile(examples_dir() / name, root / "examples" / name)
    (root / "empty.txt").write_text("")
    return root


@pytest.mark.parametrize("case", list(CASES))
def test_validate_refuses_what_train_refuses_with_the_same_message(folder, case):
    task, overrides, expected = CASES[case]
    spec = "examples/text_char.toml"
    if task is not None:
        spec = f"{case.replace(' ', '_').replace(',', '')}.toml"
        (folder / spec).write_text(SPEC.replace("{TASK}", task))
    with contextlib.chdir(folder):
        code, out, err = run(["train", spec, *overrides, "--out", "runs/x", "--no-progress"])
        assert code == 1 and not (folder / "runs" / "x").exists()
        (line,) = err.strip().splitlines()
        assert line.startswith("error: ") and expected in line, line
        train_message = line.removeprefix("error: ")
        code, out, _ = run(["spec", "validate", spec, *overrides])
        assert code == 1 and "1 problem" in out
        assert train_message in " ".join(out.split()), out  # the table's lines joined
        code, out, _ = run(["--format", "json", "spec", "validate", spec, *overrides])
        (row,) = json.loads(out)
        assert code == 1 and not row["ok"]
        (problem,) = row["errors"]
        assert problem["text"].endswith(train_message), (problem, train_message)


def test_a_good_text_spec_validates(folder):
    with contextlib.chdir(folder):
        code, out, _ = run(["spec", "validate", "examples/text_char.toml"])
    assert code == 0 and out.startswith("ok"), out


def test_the_task_is_checked_with_the_model_in_one_pass(folder):
    """A model error and a task error are both reported by one validation."""
    (folder / "both.toml").write_text(SPEC.replace("{TASK}", '{ use = "text", path = "nowhere.txt" }')
                                      .replace("heads = 2", "heads = 3"))
    with contextlib.chdir(folder):
        code, out, _ = run(["--format", "json", "spec", "validate", "both.toml"])
    (row,) = json.loads(out)
    paths = sorted(e["path"] for e in row["errors"])
    assert code == 1 and "train.task" in paths and len(paths) == 2, row["errors"]
