#!/usr/bin/env python
"""The measured figures of docs/training.md, regenerated on this machine (Markdown on stdout).

    python scripts/regen_doc_figures.py                 # both sections (about 15 min on 1 idle core)
    python scripts/regen_doc_figures.py default         # the default run's table
    python scripts/regen_doc_figures.py precision       # fp32 / bf16 / torch.compile, 50 steps

``default``: `atlas train` of the embedded default spec (atlas_core/data/default_mqar.toml), its
held-out accuracy and loss at every evaluation, the time and the rate.

``precision``: the default spec for 50 steps (evaluation at the end only) three times: fp32,
``precision = "bf16"``, ``compile = true``; the final eval loss of each, its gap to fp32 (the
bound that tests/train/test_precision_compile.py checks on a shrunk spec is stated in
docs/training.md), the first step's time (torch.compile's compilation) and the whole run's time.

Runs use ``--threads`` torch threads (default 1, see scripts/example_costs.py). Times are wall
clock and CPU time of this process (torch.compile's C++ builds run in other processes); both
depend on the machine and its load, which the output states.
"""

from __future__ import annotations

import argparse
import os
import platform
import sys
import tempfile
import time
import tomllib
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from example_costs import cpu_name  # noqa: E402


def machine_line() -> str:
    import torch

    load = os.getloadavg()[0] if hasattr(os, "getloadavg") else float("nan")
    return (f"{cpu_name()}, {os.cpu_count()} cores, {torch.get_num_threads()} torch thread(s), "
            f"torch {torch.__version__}, Python {platform.python_version()}, load average "
            f"{load:.1f} at the start")


def _train(spec: dict, out: Path) -> tuple[dict, float, float, list[dict]]:
    from atlas_core.train.metrics import read_metrics
    from atlas_core.train.setup import TrainOptions
    from atlas_core.train.launch import train

    t0, c0 = time.perf_counter(), time.process_time()
    result = train(TrainOptions(spec=spec, out=str(out), progress=False))
    wall, cpu = time.perf_counter() - t0, time.process_time() - c0
    return result, wall, cpu, read_metrics(out / "metrics.jsonl")


def default_section(tmp: Path) -> str:
    from atlas_core.train.setup import default_spec_text

    spec = tomllib.loads(default_spec_text())
    spec["train"]["device"] = "cpu"
    result, wall, cpu, log = _train(spec, tmp / "default")
    evals = [r for r in log if r["kind"] == "eval"]
    tokens = result["steps"] * spec["train"]["batch_size"] * spec["train"]["task"]["seq_len"]
    lines = [
        "| step | " + " | ".join(str(r["step"]) for r in evals) + " |",
        "|---|" + "---:|" * len(evals),
        "| held-out accuracy | " + " | ".join(f"{r['accuracy']:.3f}" for r in evals) + " |",
        "| held-out loss | " + " | ".join(f"{r['loss']:.3f}" for r in evals) + " |",
        "",
        f"{result['steps']} steps: {wall:.0f} s wall clock, {cpu:.0f} s CPU time "
        f"({tokens:,} tokens; {tokens / wall:,.0f} tokens/s wall, {tokens / cpu:,.0f} tokens per "
        f"CPU second); final accuracy "
        f"{result['accuracy']:.4f}, eval loss {result['eval_loss']:.4f}, "
        f"{result['params']:,} parameters.",
    ]
    return "\n".join(lines)


def precision_section(tmp: Path, steps: int) -> str:
    from atlas_core.train.setup import default_spec_text

    rows, base = [], None
    for name, extra in (("fp32", {}), ("bf16", {"precision": "bf16"}),
                        ("fp32 + compile", {"compile": True})):
        spec = tomllib.loads(default_spec_text())
        spec["train"].update(steps=steps, eval_every=0, device="cpu", **extra)
        result, wall, cpu, log = _train(spec, tmp / name.replace(" + ", "-"))
        first = next((r["seconds"] for r in log if r.get("event") == "first_step"), float("nan"))
        if base is None:
            base = result["eval_loss"]
        gap = (result["eval_loss"] - base) / base
        rows.append(f"| {name} | {result['eval_loss']:.4f} | {gap:+.2%} | {result['accuracy']:.4f} "
                    f"| {first:.1f} | {wall:.0f} | {cpu:.0f} |")
        print(rows[-1], file=sys.stderr, flush=True)
    head = ["| run | eval loss | gap to fp32 | accuracy | first step s | wall s | CPU s |",
            "|---|---:|---:|---:|---:|---:|---:|"]
    return "\n".join(head + rows)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("sections", nargs="*", help="default and/or precision (default: both)")
    ap.add_argument("--threads", type=int, default=1, help="torch intra-op threads (default 1)")
    ap.add_argument("--steps", type=int, default=50, help="steps of the precision runs")
    args = ap.parse_args(argv)
    args.sections = args.sections or ["default", "precision"]
    unknown = sorted(set(args.sections) - {"default", "precision"})
    if unknown:
        ap.error(f"unknown section(s) {', '.join(unknown)}: choose default and/or precision")
    import torch

    torch.set_num_threads(args.threads)
    print(f"Measured on {machine_line()}.\n")
    with tempfile.TemporaryDirectory() as tmp:
        if "default" in args.sections:
            print("### The default run\n\n" + default_section(Path(tmp)) + "\n", flush=True)
        if "precision" in args.sections:
            print(f"### Precision and compilation ({args.steps} steps of the default spec)\n\n"
                  + precision_section(Path(tmp), args.steps) + "\n", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
