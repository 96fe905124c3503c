"""``atlas train [SPEC] [KEY.PATH=VALUE]...``: train a spec's model on its ``[train]`` task.

Without SPEC the embedded default (a small delta-rule model on MQAR) is trained. Overrides
(``model.d_model=64 train.lr=1e-3``) and the common flags (``--steps``, ``--lr``, ``--batch-size``,
``--seq-len``, ``--seed``, ``--device``, ``--grad-accum``, ``--threads``) change the spec before it is validated
(`atlas_core.spec.overrides`) and are saved in the run's resolved ``spec.toml``. The command runs
`atlas_core.api.train`, the Python API, and prints its result. Progress (step,
loss, tokens/s, ETA) goes to stderr; the final accuracy to stdout (JSON with ``--format json``).
The run directory holds ``metrics.jsonl``, ``curve.png``, the resolved ``spec.toml`` and
``checkpoints/``. Ctrl-C saves a checkpoint and exits with code 130; ``--resume`` continues.
"""

from __future__ import annotations

import sys
from enum import Enum
from typing import Annotated, Any, Optional

import typer

from .common import FormatOption, OutputFormat, emit, emit_error, examples, out_console, resolve_format
from .overrides import (
    OVERRIDES_HELP, BatchSizeOption, LrOption, SeedOption, SeqLenOption, StepsOption, overrides_of,
    split_words,
)


class Shard(str, Enum):
    ddp = "ddp"
    fsdp = "fsdp"


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
    words: Annotated[Optional[list[str]], typer.Argument(
        metavar="SPEC KEY.PATH=VALUE",
        help="a spec file (.toml; default: the embedded MQAR spec, or, with --resume, the "
             "checkpoint's spec), then " + OVERRIDES_HELP, show_default=False)] = None,
    steps: StepsOption = None,
    lr: LrOption = None,
    batch_size: BatchSizeOption = None,
    seq_len: SeqLenOption = None,
    seed: SeedOption = None,
    device: Annotated[Optional[Device], typer.Option("--device", help="auto, cpu or cuda (= train.device=...)", show_default=False)] = None,
    out: Annotated[Optional[str], typer.Option("--out", help="run directory (default: runs/<spec name>, the first free one)")] = None,
    resume: Annotated[Optional[str], typer.Option("--resume", help="continue from a checkpoint or run directory")] = None,
    nproc: Annotated[int, typer.Option("--nproc", min=1, help="data-parallel processes (gloo on CPU, NCCL on CUDA)")] = 1,
    context_parallel: Annotated[int, typer.Option("--context-parallel", min=1, help="split each sequence along time over R processes (memory layers pass their state between them; --nproc defaults to R)")] = 1,
    grad_accum: Annotated[Optional[int], typer.Option("--grad-accum", min=1, metavar="N", help="accumulate gradients over N micro-batches of --batch-size rows per optimizer step (= train.grad_accum=N): a step learns from N x batch_size rows", show_default=False)] = None,
    threads: Annotated[Optional[str], typer.Option("--threads", metavar="N|auto", help="torch intra-op threads per process (= train.threads=N; default auto: the idle physical cores, 1 per process under torchrun, OMP_NUM_THREADS when set)", show_default=False)] = None,
    shard: Annotated[Shard, typer.Option("--shard", help="data-parallel engine with N processes: ddp (a whole model per process) or fsdp (each process holds 1/N of the parameters and optimiser state; checkpoints stay whole; resume such a run with ddp)")] = Shard.ddp,
    progress: Annotated[bool, typer.Option("--progress/--no-progress", help="show the progress bar on stderr")] = True,
    fmt: FormatOption = None,
) -> None:
    """Train a model on its spec's task (default: a small MQAR run) and print its accuracy."""
    from atlas_core.api import train as api_train
    from atlas_core.train.errors import TrainingInterrupted

    files, texts = split_words(words, at_most=1)
    if threads is not None:  # a number, or a string the spec check refuses with its message
        value = threads.strip()
        texts = [*texts, f"train.threads={value if value.isdigit() else repr(value)}"]
    if grad_accum is not None:
        texts = [*texts, f"train.grad_accum={grad_accum}"]
    overrides = overrides_of(texts, steps=steps, lr=lr, batch_size=batch_size, seq_len=seq_len,
                             seed=seed, device=device.value if device else None)
    try:
        run = api_train(files[0] if files else None, out=out, resume=resume, nproc=nproc,
                        progress=progress, overrides=overrides, shard=shard.value,
                        context_parallel=context_parallel)
    except TrainingInterrupted as exc:  # not a failure: one line (JSON: an error object), exit 130
        if resolve_format(fmt) is OutputFormat.json:
            emit_error(exc, 130)
        else:
            sys.stderr.write(f"{exc}\n")
        raise typer.Exit(130) from None
    except KeyboardInterrupt:
        sys.stderr.write("stopped by a second Ctrl-C without saving; the last checkpoint is untouched\n")
        raise typer.Exit(130) from None
    result = run.result
    if result.get("rank", 0) == 0:  # under torchrun every rank runs this command; one reports
        emit(result, fmt, human)


def register(app: typer.Typer) -> None:
    app.command(
        "train",
        epilog=examples(
            "atlas train",
            "atlas train examples/mqar_default.toml --steps 2000 --out runs/mqar",
            "atlas train examples/titans_lmm.toml model.d_model=64 train.lr=1e-3 --steps 5",
            "atlas train --resume runs/mqar --steps 4000",
            "atlas train examples/mqar_default.toml --nproc 2",
            "atlas train --threads 1",
            "atlas train examples/text_char.toml --batch-size 4 --grad-accum 4",
            "atlas train examples/mqar_default.toml --nproc 2 --shard fsdp",
            "atlas train examples/mqar_default.toml --context-parallel 2",
        ),
    )(train)
