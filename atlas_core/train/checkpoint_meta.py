"""`CheckpointMeta`: what a checkpoint records next to its tensors (its ``meta.json``), written
and read here only.

``meta.json`` is one JSON object. A checkpoint written by training holds, in this order:

===============  ===============================================================================
``step``         the step it was saved at (the manifest's ``step`` is the one read back)
``tokens_seen``  training tokens seen so far (a resumed run counts on from it)
``elapsed_s``    training seconds so far
``world_size``   data-parallel processes of the run
``task``         the training task (`task_record`): ``use``, ``params``, ``vocab_size``,
                 ``seq_len``, the fingerprints of the files it read (``files``: `task_files`)
                 and, for text, how ids map to text (``text``: `codec.TextCodec`)
``last_eval``    the last held-out evaluation (``loss``, ``accuracy``, ...; null before one)
``optimizer``    the optimiser's non-tensor fields (`optim`)
===============  ===============================================================================

Other writers (``atlas import``, benchmark fixtures) write no training fields: their own keys
(`CheckpointMeta.extra`, first), the ``task`` when they have one, and ``optimizer``.

A checkpoint may come from anywhere, so reading (`CheckpointMeta.from_json`) checks the type of
every field it hands on: a forged or damaged ``meta.json`` is one `CheckpointError` naming the
file and the field, never a TypeError deep in training or decoding.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Mapping

from .errors import CheckpointError

META_FILE = "meta.json"
_FIX = "use an earlier checkpoint"


@dataclass
class CheckpointMeta:
    """A checkpoint's ``meta.json`` (module docstring). ``step`` is None for a checkpoint no
    training wrote (its training fields are then not written)."""

    step: int | None = None
    tokens_seen: int = 0
    elapsed_s: float = 0.0
    world_size: int = 1
    task: dict[str, Any] | None = None
    last_eval: dict[str, Any] | None = None
    optimizer: dict[str, Any] = field(default_factory=dict)
    #: keys of other writers (``atlas import``'s ``imported``), kept as they were written
    extra: dict[str, Any] = field(default_factory=dict)
    #: the file it was read from (for messages; None for a record not read from a file)
    source: Path | None = field(default=None, compare=False, repr=False)

    def to_json(self) -> bytes:
        """The bytes of ``meta.json``."""
        data: dict[str, Any] = dict(self.extra)
        if self.step is not None:
            data.update(step=self.step, tokens_seen=self.tokens_seen, elapsed_s=self.elapsed_s,
                        world_size=self.world_size)
        if self.task is not None or self.step is not None:
            data["task"] = self.task
        if self.step is not None:
            data["last_eval"] = self.last_eval
        data["optimizer"] = self.optimizer
        return json.dumps(data, indent=1, default=float).encode()

    @classmethod
    def from_json(cls, data: bytes, source: Path) -> "CheckpointMeta":
        """The record of ``meta.json``'s bytes (read from ``source``), its fields checked."""
        try:
            raw = json.loads(data)
        except ValueError as exc:
            raise CheckpointError(f"{source}: not JSON ({exc})") from None
        if not isinstance(raw, dict):
            raise CheckpointError(f"{source}: not a JSON object ({type(raw).__name__}); {_FIX}")
        known = ("step", "tokens_seen", "elapsed_s", "world_size", "task", "last_eval", "optimizer")
        task = raw.get("task")
        if task is not None and (
                not isinstance(task, dict) or not isinstance(task.get("params", {}), dict)
                or not isinstance(task.get("use", ""), (str, type(None)))):
            raise CheckpointError(f"{source}: 'task' is not a table with a task name 'use' and a "
                                  f"'params' table; {_FIX}")
        return cls(
            step=_number(raw, "step", int, None, source),
            tokens_seen=_number(raw, "tokens_seen", int, 0, source),
            elapsed_s=_number(raw, "elapsed_s", float, 0.0, source),
            world_size=_number(raw, "world_size", int, 1, source),
            task=task,
            last_eval=_table(raw, "last_eval", None, source),
            optimizer=_table(raw, "optimizer", {}, source),
            extra={k: v for k, v in raw.items() if k not in known},
            source=source,
        )

    def trained_task(self) -> dict[str, Any]:
        """The training task as recorded (``{"use": ..., "params": {...}, ...}``; ``{}`` when the
        checkpoint records none)."""
        return self.task or {}

    def recorded_files(self) -> dict[str, Any]:
        """The fingerprints of the files the training task read (``task.files``; ``{}`` when
        absent or malformed: `task_files.check_recorded` then refuses to read them again)."""
        files = self.trained_task().get("files")
        return dict(files) if isinstance(files, Mapping) else {}

    def codec(self):
        """How the checkpoint's model turns text into ids and back (`codec.TextCodec`; None: its
        task has no text); a malformed ``task.text`` is a `CheckpointError`."""
        from .codec import TextCodec

        try:
            return TextCodec.from_task_meta(self.trained_task())
        except ValueError as exc:
            raise CheckpointError(f"{self.source or META_FILE}: {exc}; {_FIX}") from None


def _number(raw: Mapping[str, Any], key: str, kind: type, default: Any, source: Path) -> Any:
    value = raw.get(key)
    if value is None:
        return default
    allowed = (int,) if kind is int else (int, float)
    if isinstance(value, bool) or not isinstance(value, allowed):
        raise CheckpointError(f"{source}: {key!r} is {value!r}, not a number; {_FIX}")
    return kind(value)


def _table(raw: Mapping[str, Any], key: str, default: Any, source: Path) -> Any:
    value = raw.get(key)
    if value is None:
        return default
    if not isinstance(value, dict):
        raise CheckpointError(f"{source}: {key!r} is not a table; {_FIX}")
    return value


def task_record(task: Any, table: Mapping[str, Any],
                files: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """The ``task`` a checkpoint records of the built training ``task`` given by ``table`` (the
    char vocabulary of a text task, or its whole subword tokenizer, included); ``files``: the
    fingerprints of the files it read (`task_files.fingerprints`)."""
    record: dict[str, Any] = {
        "use": table.get("use"),
        "params": task.params.model_dump(),
        "vocab_size": task.vocab_size,
        "seq_len": task.seq_len,
    }
    if files:
        record["files"] = dict(files)
    if task.name == "text":
        if task.params.mode == "bpe":  # the whole tokenizer: decoding needs no file
            record["text"] = {"mode": "bpe", "tokenizer": task.tokenizer.to_str()}
        else:
            record["text"] = {"mode": task.params.mode, "vocab": task.vocab}
    return record


__all__ = ["CheckpointMeta", "META_FILE", "task_record"]
