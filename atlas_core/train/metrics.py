"""The metrics log of a run (JSON lines) and its loss / accuracy curve (PNG).

Every line of ``metrics.jsonl`` is one JSON object with ``"kind"``:

- ``"train"``: ``step`` (optimizer steps done), ``loss`` (mean over the counted targets of the
  global batch), ``lr``, ``grad_norm`` (before clipping), ``tokens_per_s``, ``elapsed_s``, and
  ``balance_loss`` (the routed experts' load-balancing term) where ``[model.moe] aux_loss > 0``;
- ``"eval"``: ``step``, ``loss``, ``accuracy`` (argmax over the counted targets), ``perplexity``,
  ``tokens`` (counted targets evaluated);
- ``"run"``: start / resume / interrupt / end markers with the step;
- ``"timing"``: ``event = "first_step"`` with ``seconds`` (the first optimizer step, which pays
  torch.compile's compilation with ``compile = true``) and ``compiled``; ``event = "estimate"``
  with ``projected_s`` (the whole run's projected duration, from the steps after the first) and
  ``seconds_per_step``.

Alongside the log, the trainer prints lines a person reads on stderr (the same whether or not
stderr is a terminal; the progress bar only on a terminal): `start_line`, `eval_line`,
`estimate_line` (a warning when the run is projected to take over `LONG_RUN_S`) and `end_line`.

Resuming from step ``s`` first drops the records after ``s`` (they belong to steps that the resumed
run will redo), so the log reads as one uninterrupted run.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any, Iterable

METRICS_FILE = "metrics.jsonl"
CURVE_FILE = "curve.png"
LONG_RUN_S = 30 * 60  # a projected run longer than this gets a warning at its start


def duration(seconds: float) -> str:
    """``42 s``, ``3 min 05 s``, ``2 h 07 min``."""
    s = int(round(max(seconds, 0.0)))
    if s < 60:
        return f"{s} s"
    if s < 3600:
        return f"{s // 60} min {s % 60:02d} s"
    return f"{s // 3600} h {(s % 3600) // 60:02d} min"


def start_line(run_dir: Any, params: int, device: str, start: int, steps: int, batch: int,
               seq_len: int, precision: str = "fp32", compiled: bool = False, *,
               processes: int = 1, mode: str = "", threads: str = "", grad_accum: int = 1) -> str:
    """The first line of a run: where it goes, how big it is, what it will do, and where: the
    device, the number of processes and how they share the work (``mode``), the threads, and
    the micro-batches of a step when gradients are accumulated."""
    what = f"steps {start + 1}-{steps} of {steps}" if start else f"{steps} steps"
    where = device + (f" x {processes} processes ({mode})" if processes > 1 else "")
    extra = (f", {precision}" + (", torch.compile" if compiled else "")
             + (f", {threads}" if threads else ""))
    rows = (f"{grad_accum} x {batch} x {seq_len} tokens ({grad_accum} micro-batches of {batch} "
            "rows, gradients accumulated)" if grad_accum > 1 else f"{batch} x {seq_len} tokens")
    return f"train: run {run_dir}, {params:,} parameters on {where}{extra}; {what} of {rows}"


def eval_line(step: int, steps: int, result: dict[str, Any], train_loss: float | None,
              elapsed_s: float) -> str:
    """One evaluation: the step, the last train loss and every metric."""
    train = f"train loss {train_loss:.4f}, " if train_loss is not None else ""
    return (f"step {step}/{steps}: {train}eval loss {result['loss']:.4f}, accuracy "
            f"{result['accuracy']:.4f}, perplexity {result['perplexity']:.3f} "
            f"({duration(elapsed_s)} elapsed)")


def estimate_line(projected_s: float, seconds_per_step: float, tokens_per_s: float,
                  remaining: int) -> str:
    """The warning printed when the projected run is long (see `LONG_RUN_S`)."""
    return (f"warning: this run is projected to take {duration(projected_s)} ({remaining:,} "
            f"steps left at {seconds_per_step:.2f} s/step, {tokens_per_s:,.0f} tokens/s); "
            "lower --steps or train a smaller spec (each examples/*.toml states its cost)")


def warmup_line(steps: int, warmup_steps: int, lr: float, last_lr: float) -> str | None:
    """The warning of a run that ends inside its warm-up (the learning rate never reaches its
    peak, and the cosine never starts), or None."""
    if steps >= warmup_steps:
        return None
    return (f"warning: train.warmup_steps = {warmup_steps} is more than the run's {steps} steps: "
            f"the learning rate rises only to {last_lr:.3g} of its peak lr = {lr:.3g} and never "
            f"decays; lower train.warmup_steps (e.g. train.warmup_steps={max(steps // 10, 1)}) or "
            "raise --steps")


def end_line(result: dict[str, Any]) -> str:
    """The summary of a finished run."""
    return (f"done: {result['steps']} steps in {duration(result['time_s'])}, "
            f"{result['tokens_per_s']:,.0f} tokens/s; accuracy {result['accuracy']:.4f}, eval "
            f"loss {result['eval_loss']:.4f}, perplexity {result['perplexity']:.3f}; "
            f"checkpoint {result['checkpoint']}")


class MetricsLog:
    """Append-only JSONL writer (a no-op on non-zero ranks: ``enabled=False``)."""

    def __init__(self, path: str | Path, *, enabled: bool = True, sinks: tuple = ()) -> None:
        self.path = Path(path)
        self.enabled = enabled
        #: more writers of every record (``write(record)``, ``close()``): TensorBoard events
        self.sinks = tuple(sinks) if enabled else ()

    def truncate_after(self, step: int) -> None:
        """Drop the records of steps after ``step`` (rewritten atomically)."""
        if not self.enabled or not self.path.exists():
            return
        kept = [r for r in read_metrics(self.path) if int(r.get("step", 0)) <= step]
        tmp = self.path.with_name(f".{self.path.name}.tmp-{os.getpid()}")
        tmp.write_text("".join(json.dumps(r) + "\n" for r in kept))
        os.replace(tmp, self.path)

    def write(self, record: dict[str, Any]) -> None:
        if not self.enabled:
            return
        self.path.parent.mkdir(parents=True, exist_ok=True)
        with open(self.path, "a") as fh:
            fh.write(json.dumps(record) + "\n")
        for sink in self.sinks:
            sink.write(record)

    def close(self) -> None:
        for sink in self.sinks:
            sink.close()
        self.sinks = ()


# A record is a few hundred bytes; a longer line means the file is not a metrics log.
MAX_LINE = 1 << 20


def run_finished(run_dir: str | Path) -> bool:
    """Whether the run in ``run_dir`` wrote its end marker (its metrics log says it finished)."""
    log = Path(run_dir) / METRICS_FILE
    if not log.is_file():
        return False
    return any(r.get("kind") == "run" and r.get("event") == "end" for r in read_metrics(log))


def read_metrics(path: str | Path) -> list[dict[str, Any]]:
    """The records of a metrics file (a truncated last line, from a killed run, is skipped).

    Read line by line, each line at most `MAX_LINE` bytes: a run directory can come from
    elsewhere, and a ``metrics.jsonl`` that is a device or a 10 GB sparse file of zeros (one
    endless line) must be one error, not a read of the whole file into memory."""
    from ..safe_files import FileRefusedError, check_regular_file, format_size

    fix = "give the run directory of an `atlas train` run, or remove the file"
    check_regular_file(path, fix=fix)
    out = []
    with open(path, "rb") as fh:
        for number, raw in enumerate(iter(lambda: fh.readline(MAX_LINE + 1), b""), 1):
            if len(raw) > MAX_LINE:
                raise FileRefusedError(str(path), f"line {number} is over {format_size(MAX_LINE)}, "
                                       "so this is not a metrics log", fix)
            line = raw.strip()
            if not line:
                continue
            try:
                record = json.loads(line)
            except ValueError:  # UnicodeDecodeError included
                continue
            if isinstance(record, dict):  # readers call record.get(...)
                out.append(record)
    return out


def plot_curves(records: Iterable[dict[str, Any]], path: str | Path, title: str = "") -> str | None:
    """Save the train/eval loss and eval accuracy against the step as a PNG.

    Returns None on success, or a one-line reason when no plot was written (matplotlib missing,
    nothing to plot)."""
    records = list(records)
    train = [r for r in records if r.get("kind") == "train"]
    evals = [r for r in records if r.get("kind") == "eval"]
    if not train and not evals:
        return "no metrics to plot"
    try:
        import matplotlib

        matplotlib.use("Agg")  # files only, never a window
        import matplotlib.pyplot as plt
    except ImportError:
        return "matplotlib is not installed (pip install 'atlas-ttm[plot]'); skipped the curve"

    fig, (ax_loss, ax_acc) = plt.subplots(1, 2, figsize=(10, 4))
    if train:
        ax_loss.plot([r["step"] for r in train], [r["loss"] for r in train], label="train", lw=1)
    if evals:
        ax_loss.plot([r["step"] for r in evals], [r["loss"] for r in evals], "o-", label="eval", ms=3)
        ax_acc.plot([r["step"] for r in evals], [r["accuracy"] for r in evals], "o-", ms=3)
    ax_loss.set_xlabel("step")
    ax_loss.set_ylabel("loss")
    ax_loss.legend()
    ax_loss.grid(alpha=0.3)
    ax_acc.set_xlabel("step")
    ax_acc.set_ylabel("eval accuracy")
    ax_acc.set_ylim(0, 1)
    ax_acc.grid(alpha=0.3)
    if title:
        fig.suptitle(title)
    fig.tight_layout()
    tmp = Path(path).with_name(f".{Path(path).name}.tmp-{os.getpid()}.png")
    fig.savefig(tmp, dpi=100)
    plt.close(fig)
    os.replace(tmp, path)
    return None
