#!/usr/bin/env python
"""The training cost of each example spec: FLOPs per token and tokens/s on this machine.

    python scripts/example_costs.py                       # every examples/*.toml: a table
    python scripts/example_costs.py examples/titans_lmm.toml --write   # rewrite its header
    python scripts/example_costs.py --write               # rewrite every example's header

For each spec the model and the task of its ``[train]`` table are built as ``atlas train`` builds
them (`atlas_core.train.trainer.Trainer`, in a temporary run directory), and

- **FLOPs per token** are counted by ``torch.utils.flop_counter.FlopCounterMode`` over one
  training step's forward and backward pass (matrix products and convolutions: what the counter
  knows; elementwise work is not counted), divided by the tokens of the batch;
- **tokens/s** is the rate of full training steps (forward, backward, AdamW) after one warm-up
  step, in the process's CPU time with one thread (the wall-clock rate of one idle core; the
  wall-clock rate of the run, which depends on the machine's load, is in ``--json``), with at
  most ``--max-tokens`` tokens per step (a spec with a larger batch is timed on fewer rows and
  says so), ``--steps`` timed steps or ``--budget`` seconds, whichever ends
  first;
- the projected time of the spec's ``steps`` follows from the two.

Timing uses ``--threads`` intra-op threads (default 1): on a 2-core machine shared with other
work, torch's 2 threads wait on each other and run many times slower than one, and the CPU time
of one thread does not depend on what else the machine runs.

``--write`` replaces the ``# Cost:`` block of each spec's header comment (inserted before the
``schema =`` line when there is none). The figures depend on the machine: the block names the
CPU.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
COST_PREFIX = "# Cost:"


def cpu_name() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def measure(path: Path, steps: int, budget_s: float, max_tokens: int) -> dict:
    """FLOPs per token and tokens/s of ``path``'s training step (see the module docstring)."""
    import torch
    from torch.utils.flop_counter import FlopCounterMode

    from atlas_core.train.setup import TrainOptions, make_plan
    from atlas_core.train.trainer import Trainer

    with tempfile.TemporaryDirectory() as tmp:
        plan = make_plan(TrainOptions(spec=str(path), out=str(Path(tmp) / "run"), device="cpu",
                                      progress=False))
        trainer = Trainer(plan, progress=False)
        p, T = plan.train, trainer.task.seq_len
        rows = max(1, min(p.batch_size, max_tokens // T))
        gen = torch.Generator().manual_seed(0)
        inputs, targets = trainer.task.batch(rows, gen)
        # FLOPs of the forward and backward pass (the optimizer step is elementwise)
        trainer.model.train()
        with FlopCounterMode(display=False) as counter:
            logits = trainer.model(inputs)
            torch.nn.functional.cross_entropy(logits.float().flatten(0, 1), targets.flatten(),
                                              ignore_index=-100).backward()
        trainer.optimizer.zero_grad(set_to_none=True)
        flops_per_token = counter.get_total_flops() / (rows * T)
        trainer.train_step(inputs, targets)  # warm-up
        times, walls = [], []
        start = time.perf_counter()
        while len(times) < steps and (not times or time.perf_counter() - start < budget_s):
            inputs, targets = trainer.task.batch(rows, gen)
            t0, c0 = time.perf_counter(), time.process_time()
            trainer.train_step(inputs, targets)
            times.append(time.process_time() - c0)
            walls.append(time.perf_counter() - t0)
        per_step = sorted(times)[len(times) // 2]  # the median timed step, in CPU seconds
        tokens_per_s = rows * T / per_step
        wall_tokens_per_s = rows * T / sorted(walls)[len(walls) // 2]
        return {
            "spec": str(path.relative_to(ROOT) if path.is_relative_to(ROOT) else path),
            "params": trainer.n_params, "batch_size": p.batch_size, "timed_rows": rows,
            "seq_len": T, "steps": p.steps, "flops_per_token": flops_per_token,
            "tokens_per_s": tokens_per_s, "wall_tokens_per_s": wall_tokens_per_s,
            "timed_steps": len(times),
            "projected_s": p.steps * p.batch_size * T / tokens_per_s,
        }


def human_flops(x: float) -> str:
    for unit, scale in (("GFLOP", 1e9), ("MFLOP", 1e6), ("kFLOP", 1e3)):
        if x >= scale:
            return f"{x / scale:.1f} {unit}"
    return f"{x:.0f} FLOP"


def cost_block(r: dict, machine: str) -> list[str]:
    from atlas_core.train.metrics import duration

    rows = (f" (timed on {r['timed_rows']} of its {r['batch_size']} rows)"
            if r["timed_rows"] < r["batch_size"] else "")
    return [
        f"{COST_PREFIX} {human_flops(r['flops_per_token'])} per token (forward + backward), "
        f"{r['params']:,} parameters;",
        f"#   {r['tokens_per_s']:,.0f} tokens/s training on {machine}{rows}:",
        f"#   its {r['steps']:,} steps of {r['batch_size']} x {r['seq_len']} tokens take about "
        f"{duration(r['projected_s'])} there.",
        "#   (measured and rewritten by: python scripts/example_costs.py --write)",
    ]


def rewrite(path: Path, block: list[str]) -> None:
    """Replace (or insert before ``schema =``) the cost block of ``path``'s header comment."""
    lines = path.read_text().splitlines()
    out, i = [], 0
    while i < len(lines):
        if lines[i].startswith(COST_PREFIX):
            i += 1
            while i < len(lines) and lines[i].startswith("#   "):
                i += 1
            continue
        out.append(lines[i])
        i += 1
    at = next((k for k, line in enumerate(out) if line.startswith("schema")), 0)
    if at and out[at - 1].strip() not in ("", "#"):
        block = ["#", *block]
    out[at:at] = block
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    tmp.write_text("\n".join(out) + "\n")
    os.replace(tmp, path)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("specs", nargs="*", type=Path, help="spec files (default: examples/*.toml)")
    ap.add_argument("--steps", type=int, default=3, help="timed steps per spec (default 3)")
    ap.add_argument("--budget", type=float, default=60.0,
                    help="seconds of timed steps per spec (at least one step runs)")
    ap.add_argument("--max-tokens", type=int, default=2048, help="tokens per timed step at most")
    ap.add_argument("--threads", type=int, default=1,
                    help="torch intra-op threads (default 1: on a shared machine more threads "
                    "wait on each other)")
    ap.add_argument("--write", action="store_true", help="rewrite each spec's # Cost: block")
    ap.add_argument("--json", type=Path, help="also write the measurements here")
    ap.add_argument("--from-json", type=Path,
                    help="rewrite the headers (--write) from a --json file, measuring nothing")
    args = ap.parse_args(argv)
    import torch

    if args.from_json:
        saved = json.loads(args.from_json.read_text())
        for r in saved["results"]:
            print(f"{r['spec']}: {human_flops(r['flops_per_token'])}/token, "
                  f"{r['tokens_per_s']:,.0f} tokens/s")
            if args.write:
                rewrite(ROOT / r["spec"], cost_block(r, saved["machine"]))
        return 0
    torch.set_num_threads(args.threads)
    specs = args.specs or sorted((ROOT / "examples").glob("*.toml"))
    load = os.getloadavg()[0] if hasattr(os, "getloadavg") else float("nan")
    machine = f"one core of a {os.cpu_count()}-core {cpu_name()}"
    results = []
    for path in specs:
        path = path.resolve()
        try:
            r = measure(path, args.steps, args.budget, args.max_tokens)
        except Exception as exc:  # noqa: BLE001 - one spec's failure is reported, the rest run
            print(f"{path.name}: not measured: {type(exc).__name__}: {exc}", file=sys.stderr)
            continue
        results.append(r)
        print(f"{r['spec']:40s} {human_flops(r['flops_per_token']):>12s}/token "
              f"{r['tokens_per_s']:>9,.0f} tokens/s (wall {r['wall_tokens_per_s']:,.0f}, load "
              f"{load:.1f})  {r['steps']:>5} steps ~ "
              f"{r['projected_s'] / 60:8.1f} min", flush=True)
        if args.write:
            rewrite(path, cost_block(r, machine))
    if args.json:
        args.json.write_text(json.dumps({"machine": machine, "results": results}, indent=2) + "\n")
    return 0 if len(results) == len(specs) else 1


if __name__ == "__main__":
    sys.exit(main())
