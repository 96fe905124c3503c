"""Recovery never deletes a live writer's directory; the run lock keeps one trainer per run.

- a temporary directory named for a live process (not this one) is left alone, for a process
  that is gone (or a zombie: killed, not yet reaped) it is deleted, and all of them are when this
  process holds the run's lock;
- a second process cannot claim a run directory that one holds (one clear error naming its pid)
  and can once the holder is gone (the kernel drops the lock, even after SIGKILL);
- a new run directory is created with its spec.toml inside.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import pytest

from atlas_core.train import checkpoint as ck
from atlas_core.train.run_dir import pid_alive

_HOLD = r"""
import sys, time
from atlas_core.train.checkpoint import claim_run_dir
claim_run_dir(sys.argv[1])
print("held", flush=True)
time.sleep(60)
"""


def _temp(root, step, kind, pid):
    d = root / f".step-{step:09d}.{kind}-{pid}"
    d.mkdir(parents=True)
    (d / "model.safetensors").write_bytes(b"half")
    return d


def test_recovery_keeps_a_live_writers_directory(tmp_path):
    root = tmp_path / "run" / "checkpoints"
    sleeper = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        live = _temp(root, 5, "partial", sleeper.pid)
        mine = _temp(root, 6, "partial", os.getpid())
        gone = _temp(root, 7, "partial", 999_999_999)
        ck.recover_checkpoints(root)
        assert live.exists()
        assert not mine.exists() and not gone.exists()
    finally:
        sleeper.kill()
    sleeper_pid = sleeper.pid
    # killed but not reaped: a zombie writes nothing, its directory goes
    time.sleep(0.2)
    ck.recover_checkpoints(root)
    assert not live.exists()
    sleeper.wait()
    assert not pid_alive(sleeper_pid)


def test_the_lock_holder_tidies_every_temporary_directory(tmp_path):
    run = tmp_path / "run"
    sleeper = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        lock = ck.claim_run_dir(run)
        live = _temp(run / "checkpoints", 5, "partial", sleeper.pid)
        assert ck.holds_run_lock(run)
        ck.recover_checkpoints(run / "checkpoints")
        assert not live.exists()  # no other process can be writing a run whose lock we hold
        lock.release()
        assert not ck.holds_run_lock(run)
    finally:
        sleeper.kill()
        sleeper.wait()


def test_one_trainer_per_run_directory(tmp_path):
    run = tmp_path / "run"
    holder = subprocess.Popen([sys.executable, "-c", _HOLD, str(run)], stdout=subprocess.PIPE,
                              text=True)
    try:
        assert holder.stdout.readline().strip() == "held"
        with pytest.raises(ck.CheckpointError, match=f"another process \\(pid {holder.pid}\\)"):
            ck.claim_run_dir(run)
        holder.send_signal(signal.SIGKILL)
        holder.wait()
        lock = ck.claim_run_dir(run)  # the kernel dropped the killed holder's lock
        assert lock is not None and lock.held
        assert ck.claim_run_dir(run) is lock  # the same process may claim it again
        lock.release()
    finally:
        if holder.poll() is None:
            holder.kill()
            holder.wait()


def test_a_new_run_directory_starts_with_its_spec(tmp_path):
    run = tmp_path / "runs" / "new"
    lock = ck.claim_run_dir(run, "name = 'x'\n")
    try:
        assert (run / "spec.toml").read_text() == "name = 'x'\n"
        assert (run / ck.LOCK_FILE).read_text().strip() == str(os.getpid())
        assert sorted(p.name for p in run.parent.iterdir()) == ["new"]  # no temporary sibling
    finally:
        lock.release()
