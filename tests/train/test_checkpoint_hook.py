"""The save hook: `save_checkpoint(at=...)` calls it at each point of the protocol, the trainer
passes the one it was given (or the kill hook ``ATLAS_CHECKPOINT_KILL_AT`` asks for), and the
spawned workers get the resolved spec itself."""

from __future__ import annotations

import pytest

from atlas_core.spec import Spec
from atlas_core.train import checkpoint
from atlas_core.train.checkpoint import KILL_ENV, KillAt, kill_hook_from_env
from atlas_core.train.errors import CheckpointError
from atlas_core.train.setup import TrainOptions, make_plan, worker_options
from atlas_core.train.trainer import Trainer

ONE_SAVE = ["begin", "files", "files", "files", "files", "files", "manifest", "rename", "prune"]


def test_the_trainer_hands_its_hook_to_every_save(tmp_path, tiny_spec):
    points = []
    tiny_spec["train"].update(steps=4, checkpoint_every=2, eval_every=0)
    plan = make_plan(TrainOptions(spec=tiny_spec, out=str(tmp_path / "run"), progress=False))
    Trainer(plan, progress=False, checkpoint_hook=points.append).run()
    # saves at steps 2 and 4, and step 4 again at the end: its old copy moved aside ("swap")
    swap = ONE_SAVE[:8] + ["swap", "prune"]
    assert points == ONE_SAVE + ONE_SAVE + swap


def test_the_kill_hook_comes_from_the_environment_once(monkeypatch):
    monkeypatch.delenv(KILL_ENV, raising=False)
    assert kill_hook_from_env() is None
    hook = kill_hook_from_env({KILL_ENV: "rename:2"})
    assert isinstance(hook, KillAt) and (hook.point, hook.n) == ("rename", 2)
    assert (kill_hook_from_env({KILL_ENV: "files"}).point,
            kill_hook_from_env({KILL_ENV: "files"}).n) == ("files", 1)
    with pytest.raises(CheckpointError, match=f"{KILL_ENV}='swap:0'"):
        kill_hook_from_env({KILL_ENV: "swap:0"})


def test_the_kill_hook_counts_saves_at_begin(monkeypatch):
    killed = []
    monkeypatch.setattr(checkpoint.os, "kill", lambda pid, sig: killed.append(sig))
    monkeypatch.setattr(checkpoint.os, "_exit", lambda code: killed.append(code))
    hook = KillAt("files", 2)
    for point in ONE_SAVE:  # the first save passes
        hook(point)
    assert killed == []
    hook("begin")
    hook("files")  # the second save's first file
    assert len(killed) == 2 and killed[1] == 137


def test_workers_get_the_resolved_spec_itself(tmp_path, tiny_spec):
    plan = make_plan(TrainOptions(spec=tiny_spec, out=str(tmp_path / "run"), steps=3))
    opts = worker_options(TrainOptions(spec=tiny_spec), plan)
    assert isinstance(opts.spec, Spec) and opts.spec is plan.spec and opts.spec.train["steps"] == 3
    assert make_plan(opts).spec is plan.spec  # nothing resolved again in the worker
