#!/usr/bin/env python3
"""SIGKILL ``atlas train`` at random moments; the run must always load, resume and end bitwise
equal to an uninterrupted run.

A tiny spec trains ``--steps`` steps with a checkpoint every ``--every`` steps. One reference
run goes uninterrupted. Then, ``--kills`` times, a fresh run is started and killed with SIGKILL
either after a random delay (anywhere in the run: set-up, a step, an evaluation, a save, the
final log line) or at a random point of a random save (``ATLAS_CHECKPOINT_KILL_AT``, see
`atlas_core.train.checkpoint`: inside a checkpoint write). After every kill:

- the run directory loads (`load_checkpoint`), or holds no complete checkpoint yet;
- ``atlas train --resume DIR`` continues it (from step 0, with a note on stderr, when nothing
  was saved); with probability ``--kill-again`` the resumed run is killed again, and so on;
- when a run ends: no temporary checkpoint directory (``.step-N.partial-PID`` and the like) is
  left, and the final weights and optimizer state equal the reference run's bitwise.

Every ``atlas train`` runs in a child forked from a warm process that has imported torch and
the CLI (a fresh interpreter costs seconds); ``--fresh`` runs each as a new ``python -m atlas_cli``
process instead. Everything runs on one thread, so every run computes the same sums.

    python scripts/kill_train.py --kills 50 --seed 0
"""

from __future__ import annotations

import argparse
import json
import os
import random
import re
import signal
import subprocess
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
TEMP = re.compile(r"^\.step-\d+\.(partial|old|trash)-\d+$")
POINTS = ("begin", "files", "manifest", "rename", "swap", "prune")

TINY = {
    "schema": "atlas/1",
    "name": "kill-tiny",
    "model": {"arch": "core:lm", "vocab_size": 16, "d_model": 16, "depth": 1, "heads": 2,
              "mlp_ratio": 2.0},
    "memory": {"structure": "core:linear", "bias": "core:l2", "retention": "core:none",
               "algorithm": "core:gd", "feature_map": "core:identity", "read": "after",
               "anchor": 8, "parallel": {"use": "core:chunkwise", "chunk_size": 8}},
    "layer": {"gate_bias": {"theta": 0.0}},
    "train": {"task": {"use": "mqar", "num_pairs": 2, "seq_len": 16}, "steps": 12,
              "batch_size": 4, "lr": 3e-3, "warmup_steps": 2, "min_lr": 1e-4, "eval_every": 0,
              "eval_batches": 1, "log_every": 1, "seed": 0, "device": "cpu",
              "checkpoint_every": 4, "keep_checkpoints": 2},
}

def _toml(data: dict) -> str:
    from atlas_core.spec import dump_toml

    return dump_toml(data)


class Runner:
    """``run(args, cwd, env, kill_after) -> (code, seconds, output)``: one ``atlas`` command, in
    a child of a warm process (`atlas_core.testing.warm_atlas`) or, with ``fresh``, as a new
    ``python -m atlas_cli`` process."""

    def __init__(self, workdir: Path, spec: Path, fresh: bool = False) -> None:
        self.workdir, self.fresh, self.count = workdir, fresh, 0
        self.warm = None
        if not fresh:
            from atlas_core.testing.warm_atlas import WarmAtlas

            self.warm = WarmAtlas(workdir, spec, cwd=ROOT)

    def run(self, args, cwd, env=None, kill_after=None):
        if not self.fresh:
            return self.warm.run(args, cwd, env, kill_after)
        self.count += 1
        log = self.workdir / f"cmd{self.count}.log"
        t0 = time.perf_counter()
        with open(log, "w") as fh:
            p = subprocess.Popen([sys.executable, "-m", "atlas_cli", *[str(a) for a in args]],
                                 stdout=fh, stderr=fh, cwd=cwd,
                                 env={**os.environ, "OMP_NUM_THREADS": "1", **(env or {})})
            try:
                code = p.wait(timeout=kill_after)
            except subprocess.TimeoutExpired:
                p.send_signal(signal.SIGKILL)
                code = p.wait()
        return code, time.perf_counter() - t0, log.read_text()

    def close(self) -> None:
        if self.warm is not None:
            self.warm.close()


def final_state(run: Path):
    from atlas_core.train.checkpoint import load_checkpoint

    ckpt = load_checkpoint(run)
    return ckpt.step, ckpt.model_tensors(), ckpt.optimizer_state()[0]


def same_state(a, b) -> bool:
    import torch

    if a[0] != b[0]:
        return False
    for x, y in zip(a[1:], b[1:]):
        if x.keys() != y.keys() or not all(torch.equal(x[k], y[k]) for k in x):
            return False
    return True


def temp_dirs(run: Path) -> list[str]:
    root = run / "checkpoints"
    return sorted(p.name for p in root.iterdir() if TEMP.match(p.name)) if root.is_dir() else []


class Failure(AssertionError):
    pass


def trial(rng: random.Random, runner: Runner, spec: Path, tmp: Path, k: int, reference,
          runtime: float, steps: int, saves: int, kill_again: float, stats: Counter,
          mode: str | None = None) -> None:
    """One run killed at a random moment, then resumed (and maybe killed again) to the end.

    ``mode``: ``"time"`` (a random delay) or ``"<point>:<n>"`` (that point of the n-th save);
    None draws one at random."""
    from atlas_core.train.checkpoint import latest_checkpoint, load_checkpoint

    run = tmp / f"run{k:03d}"
    if mode is None:
        hook = rng.random() < 0.5
        if hook:
            mode = f"{rng.choice(POINTS)}:{rng.randint(1, saves)}"
    else:
        hook = mode != "time"
    env = {}
    kill_after = None
    if hook:
        env = {"ATLAS_CHECKPOINT_KILL_AT": mode}
        stats[f"kill at {mode.split(':')[0]}"] += 1
    else:
        kill_after = rng.uniform(0.0, runtime * 1.1)
    code, _, out = runner.run(["train", spec, "--out", run, "--no-progress"], tmp, env, kill_after)
    attempts = 0
    while code != 0:
        attempts += 1
        if attempts > 12:
            raise Failure(f"run {k}: still not finished after {attempts} attempts")
        if code != -signal.SIGKILL:
            raise Failure(f"run {k}: exit {code} instead of a kill or success:\n{out}")
        stats["kills"] += 1
        # the run directory always loads (or holds nothing complete yet)
        if not run.exists():
            stats["killed before the run directory existed"] += 1
            args = ["train", spec, "--out", run, "--no-progress"]
        else:
            if latest_checkpoint(run / "checkpoints") is not None:
                ck = load_checkpoint(run)
                if not 0 < ck.step <= steps:
                    raise Failure(f"run {k}: checkpoint at step {ck.step}")
                stats["left a loadable checkpoint"] += 1
            else:
                stats["left no checkpoint yet"] += 1
            if temp_dirs(run):
                stats["left a temporary directory"] += 1
            args = ["train", "--resume", run, "--no-progress"]
            if not (run / "spec.toml").is_file():  # killed before the run wrote its spec
                stats["killed before spec.toml"] += 1
                args = ["train", spec, "--resume", run, "--no-progress"]
        again = rng.random() < kill_again
        code, _, out = runner.run(args, tmp, None, rng.uniform(0, runtime) if again else None)
        if code == 0 and "is complete" in out:
            stats["killed after the end marker"] += 1  # already finished: nothing to resume
        if "starting it again from step 0" in out:  # printed before training starts
            stats["restarted from step 0"] += 1
    if code == 0 and attempts == 0:
        stats["finished before the kill"] += 1
    left = temp_dirs(run)
    if left:
        raise Failure(f"run {k}: temporary directories left after the run ended: {left}")
    if not same_state(final_state(run), reference):
        raise Failure(f"run {k}: final state differs from the uninterrupted run")
    stats["runs ending bitwise equal"] += 1


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--kills", type=int, default=50, help="runs to kill (default 50)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--steps", type=int, default=12)
    ap.add_argument("--every", type=int, default=4, help="checkpoint every N steps")
    ap.add_argument("--kill-again", type=float, default=0.3,
                    help="probability that a resumed run is killed again")
    ap.add_argument("--fresh", action="store_true", help="a new interpreter per command")
    ap.add_argument("--keep", action="store_true", help="keep the run directories")
    args = ap.parse_args(argv)
    sys.path.insert(0, str(ROOT))
    stats = run_kills(args.kills, args.seed, args.steps, args.every, args.kill_again, args.fresh,
                      keep=args.keep)
    print(json.dumps(stats, indent=1))
    return 0 if stats["failures"] == 0 else 1


def run_kills(kills: int, seed: int = 0, steps: int = 12, every: int = 4, kill_again: float = 0.3,
              fresh: bool = False, keep: bool = False, workdir: Path | None = None,
              schedule: list[str] | None = None) -> dict:
    """Run the whole procedure; returns the counts (``failures`` lists what went wrong).
    ``schedule``: the kill of each run in turn (`trial`'s ``mode``), instead of random ones."""
    import copy

    rng = random.Random(seed)
    owned = None
    if workdir is None:
        owned = tempfile.TemporaryDirectory(prefix="kill-train-")
        workdir = Path(owned.name)
    data = copy.deepcopy(TINY)
    data["train"].update(steps=steps, checkpoint_every=every)
    spec = workdir / "tiny.toml"
    spec.write_text(_toml(data))
    saves = steps // every + 1  # the periodic saves and the final one
    runner = Runner(workdir, spec, fresh)
    stats: Counter = Counter()
    failures: list[str] = []
    t0 = time.time()
    try:
        code, runtime, out = runner.run(["train", spec, "--out", workdir / "reference",
                                         "--no-progress"], workdir)
        if code != 0:
            raise RuntimeError(out)
        reference = final_state(workdir / "reference")
        for k in range(kills):
            try:
                trial(rng, runner, spec, workdir, k, reference, runtime, steps, saves,
                      kill_again, stats, schedule[k % len(schedule)] if schedule else None)
            except Failure as exc:
                failures.append(str(exc))
                print(f"FAILED: {exc}", file=sys.stderr)
    finally:
        runner.close()
        if owned is not None and not keep:
            owned.cleanup()
    return {"trials": kills, "seed": seed, "steps": steps, "checkpoint_every": every,
            "reference_run_s": round(runtime, 3), "counts": dict(sorted(stats.items())),
            "failures": len(failures), "failure_messages": failures,
            "seconds": round(time.time() - t0, 1)}


if __name__ == "__main__":
    sys.exit(main())
