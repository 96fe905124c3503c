"""`atlas train` chooses torch's intra-op threads (atlas_core.train.threads) and says so in its
start line; ``train.threads`` / ``--threads`` override the choice, and the caller's thread count
is restored after the run."""

from __future__ import annotations

import os
import subprocess
import sys
import tomllib

import pytest
import torch

from atlas_core.errors import SpecError
from atlas_core.train.metrics import start_line
from atlas_core.train.params import train_params
from atlas_core.train.setup import TrainOptions
from atlas_core.train.threads import busy_fraction, describe, physical_cores, plan_threads
from atlas_core.train.launch import train


def test_a_number_wins_then_omp_num_threads_then_torchrun_then_the_idle_cores():
    env = {"OMP_NUM_THREADS": "3"}
    assert plan_threads(5, env=env, torchrun=True, physical=8, busy=0.0) == (5, "train.threads")
    assert plan_threads("auto", env=env, torchrun=True, physical=8, busy=0.0) == (3, "OMP_NUM_THREADS")
    assert plan_threads("auto", env={}, torchrun=True, physical=8, busy=0.0) == (
        1, "1 per process under torchrun")
    assert plan_threads("auto", env={}, physical=8, busy=0.0) == (8, "8 physical cores, 0% busy")
    # a busy machine: only the idle share of the cores, at least one
    assert plan_threads("auto", env={}, physical=2, busy=0.5)[0] == 1
    assert plan_threads("auto", env={}, physical=2, busy=1.0)[0] == 1
    assert plan_threads("auto", env={}, physical=8, busy=0.25)[0] == 6
    # --nproc N: the idle cores shared by the N processes
    count, why = plan_threads("auto", env={}, physical=8, busy=0.0, processes=2)
    assert count == 4 and why.endswith("shared by 2 processes")
    assert plan_threads("auto", env={}, physical=2, busy=0.0, processes=4)[0] == 1
    # an unusable OMP_NUM_THREADS is ignored, not trusted
    assert plan_threads("auto", env={"OMP_NUM_THREADS": "x"}, physical=4, busy=0.0)[0] == 4


def test_the_measurements_are_in_range():
    assert 1 <= physical_cores() <= (os.cpu_count() or 1)
    assert 0.0 <= busy_fraction(0.02) <= 1.0


def test_the_setting_is_auto_or_a_positive_number():
    assert train_params({}).threads == "auto"
    assert train_params({"threads": 2}).threads == 2
    for bad in (0, -1, "many", True, 1.5):
        with pytest.raises(SpecError, match=r'train\.threads: must be "auto" or a number of threads'):
            train_params({"threads": bad})


def test_the_start_line_names_threads_processes_and_their_mode():
    one = start_line("runs/x", 1000, "cpu", 0, 10, 8, 64, threads=describe(2, "train.threads"))
    assert one == ("train: run runs/x, 1,000 parameters on cpu, fp32, 2 threads (train.threads); "
                   "10 steps of 8 x 64 tokens")
    two = start_line("runs/x", 1000, "cpu", 0, 10, 8, 64, processes=2, mode="data parallel, ddp",
                     threads=describe(1, "1 per process under torchrun", 2))
    assert ("on cpu x 2 processes (data parallel, ddp), fp32, 1 thread each (1 per process under "
            "torchrun);") in two


def test_a_run_uses_its_threads_and_gives_the_callers_back(tmp_path, tiny_spec, capfd):
    before = torch.get_num_threads()
    seen = []
    tiny_spec["train"].update(threads=2, steps=2)
    train(TrainOptions(spec=tiny_spec, out=str(tmp_path / "run"), progress=False),
          on_step=lambda t: seen.append(torch.get_num_threads()))
    assert seen == [2, 2] and torch.get_num_threads() == before
    assert ", 2 threads (train.threads);" in capfd.readouterr().err


def test_the_command_line_flag_sets_train_threads(tmp_path, tiny_spec):
    from atlas_core.spec import dump_toml

    tiny_spec["train"].pop("threads")
    tiny_spec["train"].update(steps=1, eval_every=0, eval_batches=1)
    spec = tmp_path / "tiny.toml"
    spec.write_text(dump_toml(tiny_spec))
    env = {k: v for k, v in os.environ.items() if k != "OMP_NUM_THREADS"}
    cmd = [sys.executable, "-m", "atlas_cli", "train", str(spec), "--no-progress"]
    proc = subprocess.run([*cmd, "--out", str(tmp_path / "a"), "--threads", "1"], env=env,
                          capture_output=True, text=True, timeout=300, cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert ", 1 thread (train.threads);" in proc.stderr
    assert tomllib.loads((tmp_path / "a" / "spec.toml").read_text())["train"]["threads"] == 1
    # without a setting nor OMP_NUM_THREADS: the measured choice, with its reason
    proc = subprocess.run([*cmd, "--out", str(tmp_path / "b")], env=env, capture_output=True,
                          text=True, timeout=300, cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert "physical core" in proc.stderr and "% busy);" in proc.stderr
    bad = subprocess.run([*cmd, "--out", str(tmp_path / "c"), "--threads", "lots"], env=env,
                         capture_output=True, text=True, timeout=300, cwd=tmp_path)
    assert bad.returncode == 1 and "train.threads" in bad.stderr and "'lots'" in bad.stderr
