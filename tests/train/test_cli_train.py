"""`atlas train`, `atlas eval`, `atlas generate`, `atlas compare` through the CLI (CliRunner)."""

from __future__ import annotations

import copy
import json
import os
import signal

import pytest
from typer.testing import CliRunner

from atlas_core.spec import dump_toml, load_spec
from atlas_core.train.setup import default_spec_text
from atlas_cli.main import make_app

from .conftest import TINY

runner = CliRunner()


def invoke(args):
    return runner.invoke(make_app(plugin_apps=False), args, catch_exceptions=False)


def _spec_file(tmp_path, data, name="spec.toml"):
    path = tmp_path / name
    path.write_text(dump_toml(data))
    return path


def _snapshot(directory):
    return {p: p.read_bytes() for p in directory.rglob("*") if p.is_file()}


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    """A finished tiny MQAR run made through `atlas train` (JSON output)."""
    tmp = tmp_path_factory.mktemp("cli")
    spec = _spec_file(tmp, TINY)
    out = tmp / "run"
    result = invoke(["--format", "json", "train", str(spec), "--out", str(out), "--no-progress"])
    assert result.exit_code == 0, result.output
    return out, json.loads(result.stdout), spec


def test_train_prints_the_result(trained):
    out, data, _ = trained
    assert data["steps"] == 6 and 0.0 <= data["accuracy"] <= 1.0
    assert data["checkpoint"].endswith("step-000000006")
    assert (out / "metrics.jsonl").exists() and (out / "curve.png").stat().st_size > 1000
    assert (out / "spec.toml").exists()


def test_eval_json_and_task_override(trained):
    out, data, _ = trained
    r = invoke(["eval", str(out), "--format", "json", "--batches", "8", "--batch-size", "32"])
    assert r.exit_code == 0, r.output
    got = json.loads(r.stdout)
    assert got["step"] == 6 and got["tokens"] == 8 * 32 * 2
    assert got["perplexity"] == pytest.approx(2.718281828 ** got["loss"], rel=1e-6)
    r = invoke(["eval", str(out), "--format", "json", "--batches", "1",
                "--task", "{use = 'mqar', num_pairs = 3, seq_len = 24}"])
    assert r.exit_code == 0, r.output
    got = json.loads(r.stdout)
    # the run's batch_size (4 rows) by default
    assert "num_pairs=3" in got["task"] and got["tokens"] == 4 * 3
    human = invoke(["eval", str(out), "--batches", "1"])
    assert human.exit_code == 0 and "accuracy" in human.stdout
    _one_error_line(invoke(["eval", str(out), "--task", "mqarr"]), "did you mean 'mqar'")
    _one_error_line(invoke(["eval", str(out), "--seq-len", "4"]),
                    "--task.num_pairs: num_pairs=2 needs seq_len >= 4 * num_pairs = 8")


def test_eval_defaults_reproduce_the_runs_final_evaluation(trained):
    """Without --batches, --batch-size and --seed, `atlas eval RUN` draws the rows of the run's
    own evaluations (its eval_batches of batch_size rows, its seed): the final eval record."""
    out, data, _ = trained
    final = [r for r in (json.loads(ln) for ln in (out / "metrics.jsonl").read_text().splitlines())
             if r["kind"] == "eval"][-1]
    r = invoke(["eval", str(out), "--format", "json"])
    assert r.exit_code == 0, r.output
    got = json.loads(r.stdout)
    assert (got["batches"], got["tokens"]) == (TINY["train"]["eval_batches"], final["tokens"])
    assert got["loss"] == pytest.approx(final["loss"], rel=1e-6)
    assert got["accuracy"] == final["accuracy"] == data["accuracy"]
    other = json.loads(invoke(["eval", str(out), "--format", "json", "--seed", "5"]).stdout)
    assert other["loss"] != got["loss"]  # the seed chooses the rows


def test_generate_ids(trained):
    out, _, _ = trained
    r = invoke(["--format", "json", "generate", str(out), "--prompt-ids", "1, 9, 2",
                "--greedy", "--max-new-tokens", "4"])
    assert r.exit_code == 0, r.output
    got = json.loads(r.stdout)
    assert got["prompt_ids"] == [1, 9, 2] and len(got["ids"]) == 4
    assert all(0 <= i < 16 for i in got["ids"])
    bad = invoke(["generate", str(out), "--prompt", "hello"])
    assert bad.exit_code == 1 and "pass --prompt-ids" in bad.stderr
    # ids have no start of their own: without a prompt, one error saying what to give
    _one_error_line(invoke(["generate", str(out)]), "no start of their own; pass --prompt-ids")
    _one_error_line(invoke(["generate", str(out), "--prompt", "a", "--prompt-ids", "1"]),
                    "not both")


def test_text_model_generates_text(tmp_path):
    corpus = tmp_path / "corpus.txt"
    corpus.write_text("abcabcabd abba cab dab " * 40)
    data = copy.deepcopy(TINY)
    data["model"]["vocab_size"] = 8
    data["train"]["task"] = {"use": "text", "path": str(corpus), "mode": "char", "seq_len": 16}
    out = tmp_path / "run"
    r = invoke(["train", str(_spec_file(tmp_path, data)), "--out", str(out), "--no-progress",
                "--steps", "2"])
    assert r.exit_code == 0, r.output
    corpus.unlink()  # generation needs only the checkpoint (it stores the vocabulary)
    g = invoke(["--format", "json", "generate", str(out), "--prompt", "ab", "--max-new-tokens", "5",
                "--seed", "3"])
    assert g.exit_code == 0, g.output
    got = json.loads(g.stdout)
    assert got["prompt"] == "ab" and len(got["text"]) == 5
    assert set(got["text"]) <= set("abcd ")
    bad = invoke(["generate", str(out), "--prompt", "xyz"])
    assert bad.exit_code == 1 and "'xyz' are not in the model's character vocabulary" in bad.stderr
    # no prompt: sampled from the start of a document (this text has no newline: its first char)
    g = invoke(["--format", "json", "generate", str(out), "--max-new-tokens", "5", "--seed", "3"])
    assert g.exit_code == 0, g.output
    got = json.loads(g.stdout)
    assert got["prompt"] == "" and got["prompt_ids"] == [0] and len(got["text"]) == 5
    assert set(got["text"]) <= set("abcd ")


# -- bad input: exit 1, one line, nothing overwritten ------------------------------------------------
def _one_error_line(result, pattern):
    assert result.exit_code == 1, result.output
    assert result.stdout == ""
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), result.stderr
    assert pattern in lines[0], lines[0]


@pytest.mark.parametrize(
    "task, pattern",
    [
        ({"use": "text", "path": "MISSING"}, "no such file"),
        ({"use": "text", "path": "EMPTY"}, "is empty"),
        ({"use": "text", "path": "SHORT", "seq_len": 99}, "seq_len=99 needs at least seq_len + 1 = 100 bytes"),
        ({"use": "sniah", "seq_len": 4, "value_len": 2}, "train.task.value_len: value_len=2 needs seq_len >= 2 * value_len + 2 = 6"),
        ("mqarr", "did you mean 'mqar'"),
    ],
    ids=["missing-file", "empty-file", "seq-len-too-long", "seq-len-sniah", "unknown-task"],
)
def test_train_bad_task(tmp_path, task, pattern):
    (tmp_path / "empty.txt").write_text("")
    (tmp_path / "short.txt").write_text("x" * 50)
    if isinstance(task, dict) and task.get("path") in ("MISSING", "EMPTY", "SHORT"):
        task = {**task, "path": str(tmp_path / f"{task['path'].lower()}.txt")}
    data = copy.deepcopy(TINY)
    data["model"]["vocab_size"] = 256
    data["train"]["task"] = task
    out = tmp_path / "run"
    _one_error_line(invoke(["train", str(_spec_file(tmp_path, data)), "--out", str(out),
                            "--no-progress"]), pattern)
    assert not out.exists()


def test_resume_with_another_spec(trained, tmp_path):
    out, _, _ = trained
    data = copy.deepcopy(TINY)
    data["memory"]["bias"] = "core:dot"
    before = _snapshot(out)
    r = invoke(["train", str(_spec_file(tmp_path, data)), "--resume", str(out), "--steps", "9",
                "--no-progress"])
    _one_error_line(r, "different model")
    assert "memory.bias.use: 'core:l2' in the checkpoint, 'core:dot' here" in r.stderr
    assert _snapshot(out) == before
    # with an override, the message names the file (it said "than <spec>"), and without a SPEC
    # "the spec given" (the checkpoint's with its overrides)
    spec_file = _spec_file(tmp_path, TINY, "same.toml")
    r = invoke(["train", str(spec_file), "model.d_model=32", "--resume", str(out), "--steps", "9",
                "--no-progress"])
    _one_error_line(r, f"was written for a different model than {spec_file} (model.d_model: 16 "
                       "in the checkpoint, 32 here)")
    r = invoke(["train", "model.d_model=32", "--resume", str(out), "--steps", "9", "--no-progress"])
    _one_error_line(r, "was written for a different model than the spec given (model.d_model")
    assert "<" not in r.stderr and _snapshot(out) == before


@pytest.mark.parametrize("damage", ["truncate", "garbage"])
def test_corrupt_checkpoint_commands(trained, tmp_path, damage):
    import shutil

    out, _, _ = trained
    copy_dir = tmp_path / "copy"
    shutil.copytree(out, copy_dir)
    ckpt = copy_dir / "checkpoints" / "step-000000006"
    f = ckpt / "optimizer.safetensors"
    data = f.read_bytes()
    f.write_bytes(data[:100] if damage == "truncate" else b"\0" * len(data))
    pattern = "truncated or altered" if damage == "truncate" else "corrupt"
    before = _snapshot(copy_dir)
    for args in (["train", "--resume", str(copy_dir), "--steps", "9", "--no-progress"],
                 ["eval", str(ckpt)], ["generate", str(ckpt), "--prompt-ids", "1"]):
        _one_error_line(invoke(args), pattern)
    assert _snapshot(copy_dir) == before


def test_train_into_an_existing_run_is_refused(trained):
    out, _, spec = trained
    before = _snapshot(out)
    _one_error_line(invoke(["train", str(spec), "--out", str(out), "--no-progress"]),
                    "already holds a run")
    assert _snapshot(out) == before


def test_ctrl_c_exits_130_with_a_checkpoint(tmp_path, monkeypatch):
    from atlas_core.train import trainer

    real = trainer.Trainer.train_step

    def step_then_interrupt(self, inputs, targets, *rest):
        stats = real(self, inputs, targets, *rest)
        if self.step == 2:  # the step being taken is the third
            os.kill(os.getpid(), signal.SIGINT)
        return stats

    monkeypatch.setattr(trainer.Trainer, "train_step", step_then_interrupt)
    out = tmp_path / "run"
    r = invoke(["train", str(_spec_file(tmp_path, TINY)), "--out", str(out), "--no-progress"])
    assert r.exit_code == 130
    assert r.stderr.strip().splitlines()[-1:] == [  # after the run's start line
        f"interrupted at step 3; checkpoint saved to {out / 'checkpoints' / 'step-000000003'}; "
        f"continue with: atlas train --resume {out / 'checkpoints' / 'step-000000003'}"]
    monkeypatch.setattr(trainer.Trainer, "train_step", real)
    r = invoke(["--format", "json", "train", "--resume", str(out), "--no-progress"])
    assert r.exit_code == 0 and json.loads(r.stdout)["steps"] == 6


def test_compare_table(tmp_path):
    # per-token rules (anchor = 1): the state is the memory M alone. The delta rule runs exactly in
    # chunks (core:exact_chunk); the dot rule's gradients ignore the memory, so core:chunkwise runs
    # it at any chunk size
    delta = copy.deepcopy(TINY)
    delta["memory"].update(anchor=1, parallel={"use": "core:exact_chunk", "chunk_size": 8})
    hebbian = copy.deepcopy(TINY)
    hebbian["name"] = "tiny-dot"
    hebbian["memory"].update(bias="core:dot", anchor=1)
    files = [_spec_file(tmp_path, delta, "a.toml"), _spec_file(tmp_path, hebbian, "b.toml")]
    r = invoke(["--format", "json", "compare", *map(str, files), "--steps", "2",
                "--out", str(tmp_path / "runs")])
    assert r.exit_code == 0, r.output
    rows = json.loads(r.stdout)
    assert [row["rule"] for row in rows] == ["l2+gd", "dot+gd"]
    # 2 heads x (d_value = 8) x (d_key = 8): the linear memory M of one layer
    assert [row["memory"] for row in rows] == [2 * 8 * 8] * 2
    assert all(row["steps"] == 2 for row in rows)
    md = invoke(["compare", *map(str, files), "--steps", "1", "--markdown",
                 "--out", str(tmp_path / "runs2")])
    assert md.exit_code == 0 and "| tiny-dot | dot+gd | 128 | 128 |" in md.stdout


def test_default_spec_is_the_example():
    from pathlib import Path

    root = Path(__file__).resolve().parents[2]
    assert load_spec(root / "examples" / "mqar_default.toml") == load_spec(default_spec_text())
