"""``atlas compare SPEC... [KEY.PATH=VALUE]...``: train several specs on the same task setting,
print one table. The overrides and the common flags apply to every spec."""

from __future__ import annotations

from typing import Annotated, Any, Optional

import typer

from .common import FormatOption, emit, examples, log, out_console
from .overrides import (
    OVERRIDES_HELP, BatchSizeOption, LrOption, SeqLenOption, StepsOption, overrides_of, split_words,
)


def human(rows: list[dict[str, Any]]) -> None:
    from rich.table import Table

    table = Table(title=f"{rows[0]['task']}, {rows[0]['steps']} steps" if rows else "")
    for col, justify in (("spec", "left"), ("rule", "left"), ("memory/layer", "right"),
                         ("state/layer", "right"), ("params", "right"), ("accuracy", "right"),
                         ("eval loss", "right"), ("time (s)", "right")):
        table.add_column(col, justify=justify)
    for r in rows:
        table.add_row(r["name"], r["rule"], f"{r['memory']:,}", f"{r['state']:,}",
                      f"{r['params']:,}", f"{r['accuracy']:.3f}", f"{r['eval_loss']:.3f}",
                      f"{r['time_s']:.0f}")
    out_console().print(table)


def compare(
    words: Annotated[list[str], typer.Argument(
        metavar="SPEC KEY.PATH=VALUE",
        help="spec files (.toml) to train and compare, then " + OVERRIDES_HELP + ", applied to "
             "every spec")],
    task: Annotated[Optional[str], typer.Option("--task", help="the task for every spec: a name or inline TOML table (default: the specs' own, which must agree)")] = None,
    steps: StepsOption = None,
    lr: LrOption = None,
    batch_size: BatchSizeOption = None,
    seq_len: SeqLenOption = None,
    seed: Annotated[int, typer.Option("--seed", min=0, help="seed for every spec (= train.seed=N)")] = 0,
    out: Annotated[Optional[str], typer.Option("--out", help="directory for the runs (default: a temporary one)")] = None,
    markdown: Annotated[bool, typer.Option("--markdown", help="print the table as Markdown")] = False,
    fmt: FormatOption = None,
) -> None:
    """Train several specs on one task setting and print one comparison table."""
    from pathlib import Path

    from atlas_core.spec.overrides import load_with_overrides
    from atlas_core.train.compare import compare as run_compare
    from atlas_core.train.compare import markdown_table
    from atlas_core.train.inference import parse_task_option

    files, texts = split_words(words)
    if not files:
        raise typer.BadParameter("give at least one SPEC to compare")
    overrides = overrides_of(texts, steps=steps, lr=lr, batch_size=batch_size, seq_len=seq_len)
    specs = [load_with_overrides(Path(f), overrides).to_dict() if overrides else f for f in files]

    def progress(row):
        log(f"{row['name']}: {row['rule']}, accuracy {row['accuracy']:.3f} in {row['time_s']:.0f} s")

    rows = run_compare(specs, task=parse_task_option(task), seed=seed, out=out, on_row=progress)
    if markdown:
        out_console().print(markdown_table(rows), markup=False, highlight=False)
        return
    emit(rows, fmt, human)


def register(app: typer.Typer) -> None:
    app.command(
        "compare",
        epilog=examples(
            "atlas compare benchmarks/mqar/main/delta.toml benchmarks/mqar/main/hebbian.toml --steps 300",
            "atlas compare benchmarks/mqar/main/delta.toml benchmarks/mqar/main/hebbian.toml model.d_model=32 --lr 1e-3",
        ),
    )(compare)
