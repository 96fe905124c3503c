"""`atlas eval` and `atlas train --resume` of byte- and char-level text runs, as a user runs them
(the `atlas` command in the folder that holds examples/, as docs/training.md says; the docs'
eval command in a fresh process, the others through the same app in this one).

- `atlas eval RUN` without --task evaluates the held-out text: the corpus the run read is read
  again because it is unchanged (its size and SHA-256 are recorded in the checkpoint), and the
  figures are the run's final evaluation (same rows: the run's eval_batches, batch_size, seed);
- the docs' `atlas eval RUN --task '{use = "text", path = "examples/text_char.txt"}'` gives the
  same figures (a byte or char model has no tokenizer file to name);
- the hint a finished run prints, `atlas train --resume RUN --steps N`, trains further;
- a corpus changed since the run is refused by both, with the way to name a file.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import subprocess
import sys
from types import SimpleNamespace

import pytest
from typer.testing import CliRunner

from atlas_cli.main import make_app
from atlas_core.example_specs import examples_dir

DOCS_TASK = '{use = "text", path = "examples/text_char.txt"}'
SMALL = ["model.d_model=16", "model.heads=2", "train.eval_every=0", "train.eval_batches=2",
         "train.batch_size=4", "train.seq_len=32", "train.warmup_steps=1", "train.threads=1"]


def atlas_process(args, cwd):
    """`atlas ARGS` in a new process, in ``cwd``."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("ATLAS_")}
    return subprocess.run([sys.executable, "-m", "atlas_cli", *args], cwd=cwd, env=env,
                          capture_output=True, text=True, timeout=300)


def atlas(args, cwd):
    """`atlas ARGS` in ``cwd``, run by the command's app in this process."""
    with contextlib.chdir(cwd):
        r = CliRunner().invoke(make_app(plugin_apps=False), args)
    return SimpleNamespace(returncode=r.exit_code, stdout=r.stdout, stderr=r.stderr)


@pytest.fixture(scope="module", params=["char", "byte"])
def text_run(request, tmp_path_factory):
    """A 3-step run of examples/text_char.toml (shrunk) in a folder holding examples/."""
    mode = request.param
    root = tmp_path_factory.mktemp(f"text-{mode}")
    (root / "examples").mkdir()
    for name in ("text_char.toml", "text_char.txt"):
        shutil.copyfile(examples_dir() / name, root / "examples" / name)
    extra = ["train.task.mode=byte"] if mode == "byte" else []
    r = atlas(["--format", "json", "train", "examples/text_char.toml", "--out", "runs/text",
               "--steps", "3", "--no-progress", *SMALL, *extra], root)
    assert r.returncode == 0, r.stderr
    return mode, root, json.loads(r.stdout)


def _eval(root, *extra):
    r = atlas(["--format", "json", "eval", "runs/text", *extra], root)
    assert r.returncode == 0, r.stderr
    return json.loads(r.stdout)


def test_eval_without_task_gives_the_runs_final_figures(text_run):
    mode, root, trained = text_run
    got = _eval(root)
    assert f"mode='{mode}'" in got["task"] and "split='val'" in got["task"]
    assert got["loss"] == pytest.approx(trained["eval_loss"], rel=1e-6)
    assert got["perplexity"] == pytest.approx(trained["perplexity"], rel=1e-6)
    assert got["tokens"] == trained["eval_tokens"] == 2 * 4 * 32
    human = atlas(["eval", "runs/text"], root)
    assert human.returncode == 0 and "perplexity" in human.stdout and "loss" in human.stdout


def test_eval_with_the_docs_task_gives_the_same(text_run):
    _, root, trained = text_run
    r = atlas_process(["--format", "json", "eval", "runs/text", "--task", DOCS_TASK], root)
    assert r.returncode == 0, r.stderr
    got = json.loads(r.stdout)
    assert got["loss"] == pytest.approx(trained["eval_loss"], rel=1e-6)


def test_the_resume_hint_trains_further_and_a_changed_corpus_is_refused(text_run, tmp_path):
    mode, root, _ = text_run
    run = tmp_path / "root"
    shutil.copytree(root, run)
    r = atlas(["--format", "json", "train", "--resume", "runs/text", "--steps", "3"], run)
    assert r.returncode == 0, r.stderr
    hint = "to train further: atlas train --resume runs/text --steps N with N > 3"
    assert hint in r.stderr  # the run is complete: the hint ...
    r = atlas(["--format", "json", "train", "--resume", "runs/text", "--steps", "4", "--no-progress"],
              run)
    assert r.returncode == 0, r.stderr  # ... is a command that works
    assert json.loads(r.stdout)["steps"] == 4
    with open(run / "examples" / "text_char.txt", "a") as fh:
        fh.write("one more line\n")
    for args in (["eval", "runs/text"], ["train", "--resume", "runs/text", "--steps", "5"]):
        r = atlas(args, run)
        assert r.returncode == 1 and r.stdout == ""
        (line,) = r.stderr.strip().splitlines()
        assert line.startswith("error: ") and "examples/text_char.txt" in line, line
        assert "is not the one the run read (its size is not the " in line, line
    assert "--task '{use = \"core:text\", path = \"FILE\"}'" in atlas(["eval", "runs/text"], run).stderr
