"""What a run tells a person, and when: the start line (and a warning when the run ends inside its
learning-rate warm-up), the first step's time (and compilation),
the warning of a run projected to take more than `metrics.LONG_RUN_S`, the evaluation lines, all
on stderr through the progress bar (rank 0), with the ``timing`` records of ``metrics.jsonl``.
`metrics` words the lines."""

from __future__ import annotations

from typing import Any

from .compile import compile_cache_dir, graph_breaks
from .metrics import (
    LONG_RUN_S, MetricsLog, duration, estimate_line, eval_line, start_line, warmup_line,
)
from .progress import Progress


class RunReport:
    """The lines and timing records of one run. ``lines``: whether this process prints (rank 0);
    `progress` is replaced by the run's bar when it starts."""

    def __init__(self, log: MetricsLog, lines: bool) -> None:
        self.log, self.lines = log, lines
        self.progress = Progress(False, 0, 0, lines=lines)

    def bar(self, enabled: bool, total: int, start: int) -> Progress:
        self.progress = Progress(enabled, total, start, lines=self.lines)
        return self.progress

    def say(self, line: str) -> None:
        """One line on stderr (rank 0), through the progress bar when one is shown."""
        self.progress.say(line)

    def start(self, run_dir: Any, params: int, device: str, step: int, p: Any, seq_len: int,
              processes: int, mode: str, threads: str, note: str | None) -> None:
        self.say(start_line(run_dir, params, device, step, p.steps, p.batch_size, seq_len,
                            p.precision, p.compile, processes=processes, mode=mode,
                            threads=threads, grad_accum=p.grad_accum)
                 + (f"; {note}" if note else ""))
        from .optim import lr_at

        short = warmup_line(p.steps, p.warmup_steps, p.lr, lr_at(p.steps - 1, p))
        if short and step < p.steps:
            self.say(short)

    def evaluated(self, step: int, steps: int, result: dict[str, Any], train_loss: float | None,
                  elapsed: float) -> None:
        self.say(eval_line(step, steps, result, train_loss, elapsed))

    def first_step(self, step: int, seconds: float, compiled: bool) -> None:
        self.log.write({"kind": "timing", "event": "first_step", "step": step,
                        "seconds": seconds, "compiled": compiled})
        if compiled:
            self.say(f"compile: the first step took {duration(seconds)} ({seconds:.1f} s), "
                     f"compiling the model{graph_breaks()}; compiled code is cached in "
                     f"{compile_cache_dir()}")

    def estimate(self, step: int, elapsed: float, seconds_per_step: float, remaining: int,
                 tokens_per_step: int) -> None:
        projected = elapsed + remaining * seconds_per_step
        self.log.write({"kind": "timing", "event": "estimate", "step": step,
                        "projected_s": projected, "seconds_per_step": seconds_per_step})
        if projected > LONG_RUN_S:
            self.say(estimate_line(projected, seconds_per_step,
                                   tokens_per_step / max(seconds_per_step, 1e-9), remaining))
