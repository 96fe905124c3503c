"""``atlas train [SPEC]``: train a spec's model on its ``[train]`` task.

Without SPEC the embedded default (a small delta-rule model on MQAR) is trained. Progress (step,
loss, tokens/s, ETA) goes to stderr; the final accuracy to stdout (JSON with ``--format json``).
The run directory holds ``metrics.jsonl``, ``curve.png``, the resolved ``spec.toml`` and
``checkpoints/``. Ctrl-C saves a checkpoint and exits with code 130; ``--resume`` continues.
"""

from __future__ import annotations

import sys
from enum import Enum
from typing import Annotated, Any, Optional

import typer

from .common import FormatOption, emit, examples, out_console


class Device(str, Enum):
    auto = "auto"
    cpu = "cpu"
    cuda = "cuda"


def human(r: dict[str, Any]) -> None:
    con = out_console()
    con.print(
        f"accuracy {r['accuracy']:.4f}  (eval loss {r['eval_loss']:.4f}, perplexity "
        f"{r['perplexity']:.3f}, {r['eval_tokens']} targets) after {r['steps']} steps in "
        f"{r['time_s']:.0f} s", markup=False, highlight=False,
    )
    con.print(f"run: {r['run_dir']}  checkpoint: {r['checkpoint']}"
              + (f"  curve: {r['curve']}" if r.get("curve") else ""), markup=False, highlight=False)


def train(
    spec: Annotated[Optional[str], typer.Argument(
        help="a spec file (.toml); default: the embedded MQAR spec (or, with --resume, the "
             "checkpoint's spec)", show_default=False)] = None,
    steps: Annotated[Optional[int], typer.Option("--steps", min=1, help="total optimizer steps (overrides train.steps)")] = None,
    out: Annotated[Optional[str], typer.Option("--out", help="run directory (default: runs/<spec name>, the first free one)")] = None,
    resume: Annotated[Optional[str], typer.Option("--resume", help="continue from a checkpoint or run directory")] = None,
    device: Annotated[Optional[Device], typer.Option("--device", help="auto, cpu or cuda (overrides train.device)")] = None,
    seed: Annotated[Optional[int], typer.Option("--seed", min=0, help="overrides train.seed")] = None,
    nproc: Annotated[int, typer.Option("--nproc", min=1, help="data-parallel processes (gloo on CPU, NCCL on CUDA)")] = 1,
    progress: Annotated[bool, typer.Option("--progress/--no-progress", help="show the progress bar on stderr")] = True,
    fmt: FormatOption = None,
) -> None:
    """Train a model on its spec's task (default: a small MQAR run) and print its accuracy."""
    from atlas_core.train.setup import TrainOptions
    from atlas_core.train.trainer import TrainingInterrupted
    from atlas_core.train.trainer import train as run_training

    opts = TrainOptions(spec=spec, out=out, resume=resume, steps=steps, seed=seed,
                        device=device.value if device else None, progress=progress)
    try:
        result = run_training(opts, nproc=nproc)
    except TrainingInterrupted as exc:
        sys.stderr.write(f"{exc}\n")
        raise typer.Exit(130) from None
    except KeyboardInterrupt:
        sys.stderr.write("stopped by a second Ctrl-C without saving; the last checkpoint is untouched\n")
        raise typer.Exit(130) from None
    if result.get("rank", 0) == 0:  # under torchrun every rank runs this command; one reports
        emit(result, fmt, human)


def register(app: typer.Typer) -> None:
    app.command(
        "train",
        epilog=examples(
            "atlas train",
            "atlas train examples/mqar_default.toml --steps 2000 --out runs/mqar",
            "atlas train --resume runs/mqar --steps 4000",
            "atlas train examples/mqar_default.toml --nproc 2",
        ),
    )(train)
