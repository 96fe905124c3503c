"""Every error training raises, in one place (each is an `atlas_core.errors.AtlasError`: the CLI
prints its message as one line and exits 1, or 130 for `TrainingInterrupted`).

The modules that raise them re-export their names (``atlas_core.train.checkpoint.CheckpointError``
is this `CheckpointError`), so either import works.
"""

from __future__ import annotations

from pathlib import Path

from ..errors import AtlasError


class CheckpointError(AtlasError, ValueError):
    """A checkpoint that cannot be used: missing, incomplete, corrupt or from another spec (or a
    run directory that another process is training)."""


class RunDirError(AtlasError, ValueError):
    """The output directory already holds a run, or cannot be used."""


class TrainingInterrupted(AtlasError):
    """The run was stopped by Ctrl-C after saving a checkpoint of ``step``."""

    def __init__(self, step: int, checkpoint: str | Path | None):
        self.step, self.checkpoint = step, checkpoint
        where = f"checkpoint saved to {checkpoint}" if checkpoint else "no checkpoint saved"
        resume = f"; continue with: atlas train --resume {checkpoint}" if checkpoint else ""
        super().__init__(f"interrupted at step {step}; {where}{resume}")


class TrainingDiverged(AtlasError, ValueError):
    """The loss became nan or inf."""


class CompileFailed(AtlasError, RuntimeError):
    """torch.compile could not compile the model."""


class DistributedError(AtlasError, RuntimeError):
    """A worker process failed; the message is the worker's own error line."""


class TaskDataError(AtlasError, ValueError):
    """A task's data cannot be used (an empty file, a window longer than the file, ...)."""


class TaskFileNotFoundError(AtlasError, FileNotFoundError):
    """A file a task was told to read does not exist."""


class TokenizerError(AtlasError, ValueError):
    """A tokenizer that cannot be trained, read or used."""


class TensorBoardMissing(AtlasError, ImportError):
    """``tensorboard = true`` without the tensorboard package."""


__all__ = ["CheckpointError", "CompileFailed", "DistributedError", "RunDirError", "TaskDataError",
           "TaskFileNotFoundError", "TensorBoardMissing", "TokenizerError", "TrainingDiverged",
           "TrainingInterrupted"]
