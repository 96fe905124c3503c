"""What a checkpoint records about the task its model was trained on: `trained_task` (the
``task`` entry of ``meta.json``, checked) and `checkpoint_codec` (how its model turns text into
ids and back). Read by inference, evaluation, export and `atlas_core.load` alike."""

from __future__ import annotations

from typing import Any

from .codec import TextCodec
from .errors import CheckpointError


def trained_task(ckpt: Any) -> dict[str, Any]:
    """``meta["task"]`` of ``ckpt`` as a mapping with a mapping ``params`` (a forged or damaged
    ``meta.json`` is one `CheckpointError`, not a TypeError deep in the task code)."""
    meta = ckpt.meta if isinstance(ckpt.meta, dict) else {}
    trained = meta.get("task") or {}
    if (not isinstance(trained, dict) or not isinstance(trained.get("params", {}), dict)
            or not isinstance(trained.get("use", ""), (str, type(None)))):
        raise CheckpointError(f"{ckpt.path / 'meta.json'}: 'task' is not a table with a task "
                              "name 'use' and a 'params' table; use an earlier checkpoint")
    return trained


def checkpoint_codec(ckpt: Any) -> TextCodec | None:
    """How the checkpoint's model turns text into ids and back (None: its task has no text)."""
    trained = trained_task(ckpt)
    try:
        return TextCodec.from_task_meta(trained)
    except ValueError as exc:
        raise CheckpointError(f"{ckpt.path / 'meta.json'}: {exc}; use an earlier checkpoint") from None


__all__ = ["trained_task", "checkpoint_codec"]
