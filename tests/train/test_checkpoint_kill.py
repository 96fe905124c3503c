"""Checkpoints that cannot be lost: `atlas train` SIGKILLed at every point of a save.

The run: 4 steps, ``checkpoint_every = 2``, so the process saves three times: step 2, step 4
(periodic) and step 4 again (the final save, which replaces the periodic copy with two renames).
``ATLAS_CHECKPOINT_KILL_AT=<point>:<n>`` (see `atlas_core.train.checkpoint`) SIGKILLs it at
``<point>`` of its ``n``-th save. After every kill, with ``keep_checkpoints`` 1 and 2:

- the run directory resolves to a complete checkpoint of the step expected for that point (never
  older than the save before the killed one), or to none when the first save was killed before
  its manifest;
- ``atlas train --resume`` continues the run (from step 0 when nothing was saved), leaves no
  temporary directory behind and at most ``keep`` checkpoints;
- the final weights and optimiser state equal those of an uninterrupted run bitwise (CPU).

Each command runs `atlas train` in a child forked from a warm process that has imported torch and
the CLI and trained once (a fresh interpreter costs seconds per run, its first steps more); one
test runs the real command as a fresh subprocess. Everything runs on one thread, so every run
computes the same floating-point sums.
"""

from __future__ import annotations

import copy
import json
import os
import re
import signal
import subprocess
import sys

import pytest
import torch

from atlas_core.spec import dump_toml
from atlas_core.train.checkpoint import KILL_ENV, load_checkpoint

from .conftest import TINY

STEPS = 4
# (save n, point) -> the step of the checkpoint the run directory must hold after the kill
# (None: nothing saved yet). Save 1 writes step 2, saves 2 and 3 step 4.
EXPECTED = {
    **{(1, point): None for point in ("begin", "files", "manifest")},
    **{(1, point): 2 for point in ("rename", "prune")},
    **{(2, point): 2 for point in ("begin", "files", "manifest")},
    **{(2, point): 4 for point in ("rename", "prune")},
    **{(3, point): 4 for point in ("begin", "files", "manifest", "rename", "swap", "prune")},
}
TEMP = re.compile(r"^\.step-\d+\.(partial|old|trash)-\d+$")

@pytest.fixture(scope="module")
def atlas(tmp_path_factory):
    """``atlas(args, cwd, env=None) -> (exit code, output)``: `atlas train ...` in a child forked
    from a warm process (`atlas_core.testing.warm_atlas`); the exit code is ``-9`` for a child
    killed by SIGKILL."""
    from atlas_core.testing.warm_atlas import WarmAtlas

    logs = tmp_path_factory.mktemp("logs")
    warm = WarmAtlas(logs, _spec(logs, 2))

    def run(args, cwd, env=None):
        code, _, output = warm.run(args, cwd, env)
        return code, output

    yield run
    warm.close()


def _spec(tmp_path, keep):
    data = copy.deepcopy(TINY)
    data["train"].update(steps=STEPS, checkpoint_every=2, keep_checkpoints=keep, eval_every=0,
                         eval_batches=1)
    path = tmp_path / f"keep{keep}.toml"
    path.write_text(dump_toml(data))
    return path


def _state(path):
    ckpt = load_checkpoint(path)
    return ckpt.step, ckpt.model_tensors(), ckpt.optimizer_state()[0], ckpt.rng()


def _assert_same(got, want):
    for a, b in zip(got[1:], want[1:]):
        assert a.keys() == b.keys()
        for k in a:
            assert torch.equal(a[k], b[k]), k


@pytest.fixture(scope="module")
def reference(atlas, tmp_path_factory):
    """The uninterrupted run's final state, and that of the same run resumed to 5 steps."""
    tmp = tmp_path_factory.mktemp("reference")
    run = tmp / "run"
    code, out = atlas(["train", _spec(tmp, 2), "--out", run, "--no-progress"], tmp)
    assert code == 0, out
    final = _state(run)
    code, out = atlas(["train", "--resume", run, "--steps", 5, "--no-progress"], tmp)
    assert code == 0, out
    return {STEPS: final, 5: _state(run)}


def _checkpoint_names(run):
    return sorted(p.name for p in (run / "checkpoints").iterdir())


@pytest.mark.parametrize("keep", [1, 2])
@pytest.mark.parametrize("save, point", list(EXPECTED), ids=[f"{p}:{n}" for n, p in EXPECTED])
def test_a_kill_at_any_point_of_a_save_loses_nothing(atlas, reference, tmp_path, keep, save, point):
    run = tmp_path / "run"
    code, out = atlas(["train", _spec(tmp_path, keep), "--out", run, "--no-progress"], tmp_path,
                      {KILL_ENV: f"{point}:{save}"})
    assert code == -signal.SIGKILL, out
    ckroot = run / "checkpoints"
    names = _checkpoint_names(run)
    expected = EXPECTED[save, point]

    # What the kill left on disk is the state of that point (so the hook really stopped there).
    assert any(".partial-" in n for n in names) == (point != "prune"), names
    assert any(".old-" in n for n in names) == (save == 3 and point in ("swap", "prune")), names
    if point == "swap":  # between the renames: step 4 exists only under temporary names
        assert "step-000000004" not in names
        assert any(n.startswith(".step-000000004.old-") for n in names)
        assert any(n.startswith(".step-000000004.partial-") for n in names)
        # the printed path of the checkpoint still resolves (to its complete copy)
        assert load_checkpoint(ckroot / "step-000000004").step == 4
    if point == "prune" and save == 2:  # the new checkpoint is in place, nothing pruned yet
        assert {"step-000000002", "step-000000004"} <= set(names)

    # The run directory holds a complete checkpoint no older than the save before this one.
    if expected is None:
        with pytest.raises(Exception, match="no complete checkpoint"):
            load_checkpoint(run)
    else:
        state = _state(run)
        assert state[0] == expected
        assert _checkpoint_names(run) == names  # reading renamed and deleted nothing
        if expected == STEPS:  # the last step: these are already the final weights
            _assert_same(state, reference[STEPS])

    # --resume continues; a run whose last step was saved (killed in the final save) is finished:
    # no step is trained, the final evaluation and end marker are written
    target = STEPS
    args = ["train", "--resume", run, "--no-progress", "--format", "json"]
    code, out = atlas(args + (["--steps", target] if target != STEPS else []), tmp_path)
    assert code == 0, out
    assert json.loads(out[out.index("{"):])["steps"] == target
    if expected is None:
        assert "holds no checkpoint (the run stopped before its first one): starting it again " \
               "from step 0" in out
    if (save, point) in ((1, "rename"), (2, "rename"), (3, "swap")):
        assert "recovered " in out  # the complete copy was adopted under its name
    else:
        assert "recovered " not in out
    names = _checkpoint_names(run)
    assert not any(TEMP.match(n) for n in names), names
    assert len(names) <= keep and names[-1] == f"step-{target:09d}"
    final = _state(run)
    assert final[0] == target
    _assert_same(final, reference[target])


def test_the_real_command_killed_between_the_renames(atlas, reference, tmp_path):
    """The kill through a fresh ``python -m atlas_cli`` process (keep 1 between the renames, where
    nothing was loadable before): the hook works in the installed command."""
    run = tmp_path / "run"
    env = {**os.environ, KILL_ENV: "swap:3", "OMP_NUM_THREADS": "1"}
    cmd = [sys.executable, "-m", "atlas_cli", "train", str(_spec(tmp_path, 1)), "--out", str(run),
           "--no-progress"]
    r = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=120)
    assert r.returncode == -signal.SIGKILL, r.stderr
    assert not (run / "checkpoints" / "step-000000004").exists()
    _assert_same(_state(run), reference[STEPS])
    code, out = atlas(["train", "--resume", run, "--steps", 5, "--no-progress"], tmp_path)
    assert code == 0, out
    assert _checkpoint_names(run) == ["step-000000005"]
    _assert_same(_state(run), reference[5])


def test_a_fresh_run_may_reuse_a_directory_killed_before_its_first_checkpoint(atlas, tmp_path):
    run = tmp_path / "run"
    spec = _spec(tmp_path, 2)
    code, out = atlas(["train", spec, "--out", run, "--no-progress"], tmp_path,
                      {KILL_ENV: "manifest:1"})
    assert code == -signal.SIGKILL, out
    assert (run / "metrics.jsonl").exists()
    code, out = atlas(["train", spec, "--out", run, "--no-progress"], tmp_path)
    assert code == 0, out
    assert f"--out {run} held a run stopped before its first checkpoint" in out
    records = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    starts = [r for r in records if r["kind"] == "run" and r["event"] == "start"]
    assert len(starts) == 1  # the killed run's log was started over, not appended to
    assert _checkpoint_names(run) == ["step-000000002", "step-000000004"]
    # a finished run keeps its directory, with or without its checkpoints
    code, out = atlas(["train", spec, "--out", run, "--no-progress"], tmp_path)
    assert code == 1 and "already holds a run" in out
    for p in (run / "checkpoints").iterdir():
        for f in p.iterdir():
            f.unlink()
        p.rmdir()
    code, out = atlas(["train", spec, "--out", run, "--no-progress"], tmp_path)
    assert code == 1 and "already holds a run" in out


@pytest.mark.parametrize("value", ["swapp", "swap:0", "swap:x"])
def test_a_bad_kill_point_is_one_clear_error(atlas, tmp_path, value):
    code, out = atlas(["train", _spec(tmp_path, 1), "--out", tmp_path / "run", "--no-progress"],
                      tmp_path, {KILL_ENV: value})
    assert code == 1, out
    lines = out.strip().splitlines()
    assert lines[-1].startswith("error: ") and f"{KILL_ENV}={value!r}" in lines[-1], out
    assert "begin, files, manifest, rename, swap, prune" in lines[-1]


def test_resuming_a_finished_run_succeeds_without_training(atlas, tmp_path):
    """Only a run that did not write its end marker is finished by a plain ``--resume``; a
    finished one (a job requeued after its end) exits 0 and says the run is complete."""
    run = tmp_path / "run"
    code, out = atlas(["train", _spec(tmp_path, 1), "--out", run, "--no-progress"], tmp_path)
    assert code == 0, out
    names = _checkpoint_names(run)
    code, out = atlas(["train", "--resume", run, "--no-progress"], tmp_path)
    assert code == 0 and f"the run {run} is complete" in out, out
    assert _checkpoint_names(run) == names


def test_restarting_an_unsaved_run_does_not_let_its_spec_choose_a_file(atlas, tmp_path):
    """A run killed before its first checkpoint restarts from its own spec.toml, except when that
    spec reads a local file: like a checkpoint's spec, it may not choose which file is read."""
    text = tmp_path / "corpus.txt"
    text.write_text("the quick brown fox jumps over the lazy dog\n" * 40)
    data = copy.deepcopy(TINY)
    data["model"]["vocab_size"] = 256
    data["train"].update(task={"use": "text", "path": str(text), "seq_len": 16}, steps=STEPS,
                         checkpoint_every=2, eval_every=0, eval_batches=1)
    spec = tmp_path / "text.toml"
    spec.write_text(dump_toml(data))
    run = tmp_path / "run"
    code, out = atlas(["train", spec, "--out", run, "--no-progress"], tmp_path, {KILL_ENV: "manifest:1"})
    assert code == -signal.SIGKILL, out
    code, out = atlas(["train", "--resume", run, "--no-progress"], tmp_path)
    assert code == 1 and "is read again only when it is the file the run read: no checkpoint " \
        "of the run recorded its size and SHA-256" in out, out
    assert "Traceback" not in out
    code, out = atlas(["train", spec, "--resume", run, "--no-progress"], tmp_path)  # named: fine
    assert code == 0, out
