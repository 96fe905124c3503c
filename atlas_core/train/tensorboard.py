"""TensorBoard event files beside ``metrics.jsonl`` (``[train] tensorboard = true``; optional
extra ``tensorboard``).

Every record the trainer logs is mirrored as scalars in ``RUN_DIR/tensorboard/``:

- a ``"train"`` record: ``train/loss``, ``train/lr``, ``train/grad_norm``, ``train/tokens_per_s``;
- an ``"eval"`` record: ``eval/loss``, ``eval/accuracy``, ``eval/perplexity``;

each at its ``step``. ``tensorboard --logdir runs`` then shows every run side by side while it
trains. ``metrics.jsonl`` stays the record of truth (resuming truncates it; TensorBoard shows the
redone steps as a second curve segment).
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

from .errors import TensorBoardMissing

TB_DIR = "tensorboard"
_SCALARS = {
    "train": ("loss", "lr", "grad_norm", "tokens_per_s"),
    "eval": ("loss", "accuracy", "perplexity"),
}


class TensorBoardSink:
    """Writes the scalars of metric records as TensorBoard events (see the module docstring)."""

    def __init__(self, run_dir: str | Path) -> None:
        try:
            from torch.utils.tensorboard import SummaryWriter
        except ImportError:
            raise TensorBoardMissing(
                "train.tensorboard = true needs the tensorboard package: pip install "
                "'atlas-ttm[tensorboard]' (or set tensorboard = false)") from None
        self.path = Path(run_dir) / TB_DIR
        self.writer = SummaryWriter(log_dir=str(self.path))

    def write(self, record: dict[str, Any]) -> None:
        kind = record.get("kind")
        step = record.get("step")
        if kind not in _SCALARS or not isinstance(step, int):
            return
        for key in _SCALARS[kind]:
            value = record.get(key)
            if isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value):
                self.writer.add_scalar(f"{kind}/{key}", float(value), step)
        if kind == "eval":
            self.writer.flush()  # an evaluation is worth seeing at once

    def close(self) -> None:
        self.writer.flush()
        self.writer.close()
