"""Repeat a short data-parallel run and check every repetition ends cleanly.

Each repetition trains a small spec for a few steps with 2 processes, launched by ``torchrun``
(default) or by ``atlas train --nproc 2``, in a fresh run directory, and checks:

- the exit code is 0 (no rank aborted, none was killed);
- rank 0 printed the summary line (``accuracy ...`` on stdout);
- the run is complete: ``curve.png``, the final checkpoint and the ``end`` record in
  ``metrics.jsonl``.

Usage::

    python scripts/repeat_torchrun.py                 # 20 torchrun repetitions
    python scripts/repeat_torchrun.py -n 5 --launcher nproc --steps 10

Prints one line per repetition and a final count; exits 1 if any repetition failed.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

SPEC = """\
schema = "atlas/1"
name = "repeat"

[model]
arch = "core:lm"
vocab_size = 16
d_model = 16
depth = 1
heads = 2

[memory]
structure = "core:linear"
bias = "core:l2"
algorithm = "core:gd"

[train]
task = {use = "mqar", num_pairs = 2, seq_len = 16}
batch_size = 4
lr = 3e-3
warmup_steps = 2
eval_every = 0
eval_batches = 1
log_every = 1
seed = 0
device = "cpu"
"""


def command(launcher: str, spec: Path, out: Path, steps: int, port: int) -> list[str]:
    train = ["train", str(spec), "--steps", str(steps), "--out", str(out), "--no-progress"]
    if launcher == "torchrun":
        return [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2",
                "--master_port", str(port), "-m", "atlas_cli.main", *train]
    return [sys.executable, "-m", "atlas_cli.main", *train, "--nproc", "2"]


def check(proc: subprocess.CompletedProcess, out: Path, steps: int) -> list[str]:
    """What is wrong with one finished repetition (empty: nothing)."""
    problems = []
    if proc.returncode != 0:
        problems.append(f"exit code {proc.returncode}")
    if sum(line.startswith("accuracy ") for line in proc.stdout.splitlines()) != 1:
        problems.append("no summary line on stdout")
    if not (out / "curve.png").is_file():
        problems.append("no curve.png")
    from atlas_core.train.checkpoint import step_dir_name

    if not (out / "checkpoints" / step_dir_name(steps)).is_dir():
        problems.append(f"no checkpoint of step {steps}")
    log = out / "metrics.jsonl"
    records = [json.loads(x) for x in log.read_text().splitlines() if x.strip()] if log.is_file() else []
    if not any(r.get("kind") == "run" and r.get("event") == "end" for r in records):
        problems.append("no end record in metrics.jsonl")
    return problems


def repeat(n: int, launcher: str, steps: int, timeout: float, echo=print) -> list[dict]:
    """Run ``n`` repetitions; one record per repetition (``ok``, ``problems``, ``seconds``)."""
    from atlas_core.train.data_parallel import free_port

    records = []
    with tempfile.TemporaryDirectory(prefix="atlas-repeat-") as tmp:
        spec = Path(tmp) / "spec.toml"
        spec.write_text(SPEC)
        env = {**os.environ, "OMP_NUM_THREADS": "1"}
        for i in range(n):
            out = Path(tmp) / f"run{i}"
            t0 = time.perf_counter()
            try:
                proc = subprocess.run(command(launcher, spec, out, steps, free_port()), env=env,
                                      capture_output=True, text=True, timeout=timeout)
                problems = check(proc, out, steps)
                tail = (proc.stderr.strip().splitlines() or [""])[-1]
            except subprocess.TimeoutExpired:
                problems, tail = [f"timed out after {timeout:.0f} s"], ""
            seconds = time.perf_counter() - t0
            records.append({"ok": not problems, "problems": problems, "seconds": seconds})
            status = "ok" if not problems else "FAILED: " + "; ".join(problems) + f" ({tail})"
            echo(f"{i + 1:3d}/{n}  {seconds:5.1f} s  {status}")
    return records


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("-n", "--repeat", type=int, default=20, help="repetitions (default 20)")
    ap.add_argument("--launcher", choices=("torchrun", "nproc"), default="torchrun")
    ap.add_argument("--steps", type=int, default=20, help="training steps per run (default 20)")
    ap.add_argument("--timeout", type=float, default=300.0, help="seconds per repetition")
    args = ap.parse_args(argv)
    records = repeat(args.repeat, args.launcher, args.steps, args.timeout)
    good = sum(r["ok"] for r in records)
    print(f"{good}/{len(records)} repetitions exited 0 with the summary, curve and final checkpoint")
    return 0 if good == len(records) else 1


if __name__ == "__main__":
    sys.exit(main())
