"""``atlas eval CKPT``: loss, accuracy and perplexity of a checkpoint on a task.

``--task`` is a task name or an inline TOML table; without it the training task is used (see
`atlas_core.train.inference`). A text task is evaluated on its held-out split. ``--batches``,
``--batch-size`` and ``--seed`` default to the run's ``eval_batches``, ``batch_size`` and
``seed``: the rows of the run's own evaluations, so its final figures come out again.
"""

from __future__ import annotations

from typing import Annotated, Any, Optional

import typer

from .common import FormatOption, emit, examples, out_console
from .train import Device


def human(r: dict[str, Any]) -> None:
    out_console().print(
        f"{r['name']} at step {r['step']} on {r['task']}\n"
        f"accuracy {r['accuracy']:.4f}  loss {r['loss']:.4f}  perplexity {r['perplexity']:.3f}  "
        f"({r['tokens']} targets in {r['batches']} batches)", markup=False, highlight=False,
    )


def evaluate(
    checkpoint: Annotated[str, typer.Argument(help="a checkpoint directory or a run directory (its latest checkpoint)")],
    task: Annotated[Optional[str], typer.Option("--task", help="task name or inline TOML table; default: the training task")] = None,
    seq_len: Annotated[Optional[int], typer.Option("--seq-len", min=2, help="override the task's sequence length")] = None,
    batches: Annotated[Optional[int], typer.Option("--batches", min=1, help="number of batches (default: the run's train.eval_batches)", show_default=False)] = None,
    batch_size: Annotated[Optional[int], typer.Option("--batch-size", min=1, help="rows per batch (default: the run's train.batch_size)", show_default=False)] = None,
    seed: Annotated[Optional[int], typer.Option("--seed", min=0, help="seed of the evaluation batches (default: the run's train.seed)", show_default=False)] = None,
    device: Annotated[Device, typer.Option("--device", help="auto, cpu or cuda")] = Device.auto,
    fmt: FormatOption = None,
) -> None:
    """Evaluate a checkpoint: accuracy, loss and perplexity over the task's counted targets."""
    from atlas_core.train.inference import evaluate_checkpoint, parse_task_option

    result = evaluate_checkpoint(checkpoint, task=parse_task_option(task), seq_len=seq_len,
                                 batches=batches, batch_size=batch_size, seed=seed,
                                 device=device.value)
    emit(result, fmt, human)


def register(app: typer.Typer) -> None:
    app.command(
        "eval",
        epilog=examples(
            "atlas eval runs/mqar-default",
            "atlas eval runs/mqar-default --task '{use = \"mqar\", num_pairs = 12}' --format json",
            "atlas eval runs/text-char --task '{use = \"text\", path = \"examples/text_char.txt\"}'",
        ),
    )(evaluate)
