"""What a person reads on stderr while training (rank 0): plain lines, the same whether stderr is
a terminal or a file, and on a terminal a progress bar (step, loss, tokens/s, elapsed, ETA) under
them (`atlas_core.train.metrics` words the lines)."""

from __future__ import annotations

import sys


def is_terminal(stream) -> bool:
    try:
        return bool(stream.isatty())
    except (AttributeError, ValueError):
        return False


class Progress:
    """A rich progress bar on stderr, or nothing (``enabled`` False); `say` prints a line above
    it (or alone). ``lines``: whether lines are printed at all (rank 0 only)."""

    def __init__(self, enabled: bool, total: int, start: int, lines: bool = True) -> None:
        self.lines = lines
        self.bar = None
        if enabled:
            from rich.console import Console
            from rich.progress import (
                BarColumn, MofNCompleteColumn, Progress as Bar, TextColumn, TimeElapsedColumn,
                TimeRemainingColumn,
            )

            self.bar = Bar(
                TextColumn("step"), MofNCompleteColumn(), BarColumn(),
                TextColumn("loss {task.fields[loss]}"), TextColumn("{task.fields[tps]} tok/s"),
                TimeElapsedColumn(), TextColumn("ETA"), TimeRemainingColumn(),
                console=Console(file=sys.stderr), transient=False,
            )
            self.task = self.bar.add_task("train", total=total, completed=start, loss="-", tps="-")

    def __enter__(self):
        if self.bar is not None:
            self.bar.__enter__()
        return self

    def __exit__(self, *exc):
        if self.bar is not None:
            self.bar.__exit__(*exc)

    def update(self, step: int, loss: float, tps: float) -> None:
        if self.bar is not None:
            self.bar.update(self.task, completed=step, loss=f"{loss:.4f}", tps=f"{tps:,.0f}")

    def say(self, line: str) -> None:
        """One line on stderr, through the bar while it is drawn."""
        if not self.lines:
            return
        if self.bar is not None and self.bar.live.is_started:
            self.bar.console.print(line, markup=False, highlight=False, soft_wrap=True)
        else:
            print(line, file=sys.stderr, flush=True)
