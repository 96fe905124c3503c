"""SIGKILL ``atlas train`` at random moments: the run directory always loads, ``--resume``
continues, no temporary checkpoint directory outlives the next run, and the resumed run ends
bitwise equal to an uninterrupted one (CPU, one thread).

A bounded, seeded run of scripts/kill_train.py (which does 50 kills and more): half the kills
land after a random delay, half at a random point of a random checkpoint write
(``ATLAS_CHECKPOINT_KILL_AT``); the script also kills resumed runs again.
"""

from __future__ import annotations

import importlib.util
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def _script():
    spec = importlib.util.spec_from_file_location("kill_train_for_test", ROOT / "scripts" / "kill_train.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_killed_runs_resume_to_the_uninterrupted_result(tmp_path):
    """Four runs of 6 steps (a checkpoint every 2): killed inside the first checkpoint write
    (nothing saved yet), at a random moment, just before the manifest of the second write, and
    at a random moment again; each is then resumed to its end (the script also kills resumed
    runs again)."""
    kill = _script()
    stats = kill.run_kills(kills=4, seed=3, steps=6, every=2, kill_again=0.0, workdir=tmp_path,
                           schedule=["files:1", "time", "manifest:2", "time"])
    assert stats["failures"] == 0, stats["failure_messages"]
    counts = stats["counts"]
    assert counts["runs ending bitwise equal"] == 4, counts
    assert counts["kills"] >= 2, counts
    # files:1 left no checkpoint: --resume started the run again from step 0
    assert counts["left no checkpoint yet"] >= 1 and counts["restarted from step 0"] >= 1, counts
    # manifest:2 left the step-2 checkpoint and a .partial directory, gone after the next run
    assert counts["left a loadable checkpoint"] >= 1, counts
    assert counts["left a temporary directory"] >= 2, counts
