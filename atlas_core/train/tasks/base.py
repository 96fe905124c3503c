"""The common shape of a training task: validated params, a vocabulary size, seeded batches.

A task turns a ``torch.Generator`` into a batch ``(inputs, targets)``:

- ``inputs``: LongTensor ``[B, T]``, token ids in ``[0, vocab_size)``;
- ``targets``: LongTensor ``[B, T]``, the token the model must predict at each position, or
  ``IGNORE_INDEX`` (-100) where the position does not count.

So the task's loss is ``cross_entropy(logits.flatten(0, 1), targets.flatten(), ignore_index=-100)``
and its accuracy is the argmax accuracy over the positions whose target is not -100 (see
`masked_accuracy`). Every random draw goes through the generator the caller passes, so the same
seed gives the same batches; tensors are made on the CPU and the trainer moves them.

A task class is also a registry factory: ``TaskClass(params, ctx)`` with ``params`` its validated
``Params`` model (or a plain mapping, validated here, or None for the defaults).
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from typing import Any, ClassVar, Mapping

import torch
from pydantic import ValidationError

from ...errors import Issue, SpecError, did_you_mean
from ..errors import TaskDataError, TaskFileNotFoundError  # noqa: F401  (importable from here)
from ...host.registry import Params

IGNORE_INDEX = -100


class Task(ABC):
    """Base class of the synthetic and text tasks."""

    #: short name, the key in `TASKS`
    name: ClassVar[str] = ""
    #: the pydantic params model (subclass of `atlas_core.host.registry.Params`)
    Params: ClassVar[type[Params]]
    #: rows hold documents that `packed_batch` can mark (``[train] pack = true``)
    packs_documents: ClassVar[bool] = False

    def __init__(self, params: Params | Mapping[str, Any] | None = None, ctx: Any = None):
        self.params = self.parse_params(params)

    # -- params ---------------------------------------------------------------------------------
    @classmethod
    def parse_params(cls, raw: Params | Mapping[str, Any] | None, path: str = "") -> Params:
        """Validate ``raw`` into ``cls.Params``; every problem is reported in one SpecError."""
        if isinstance(raw, cls.Params):
            return raw
        if raw is None:
            raw = {}
        if isinstance(raw, Params) or not isinstance(raw, Mapping):
            raise SpecError(
                [Issue(path, f"{cls.name} params must be a table or {cls.Params.__name__}",
                       type(raw).__name__)]
            )
        try:
            return cls.Params.model_validate(dict(raw))
        except ValidationError as exc:
            issues = []
            for err in exc.errors():
                loc = ".".join(str(p) for p in err["loc"])
                where = f"{path}.{loc}" if path and loc else (path or loc)
                if err["type"] == "extra_forbidden":
                    fields = list(cls.Params.model_fields)
                    hint = did_you_mean(str(err["loc"][-1]), fields)
                    hint = hint or f"allowed keys: {', '.join(fields)}"
                    issues.append(Issue(where, "unknown key", None, hint))
                else:
                    msg = err["msg"].removeprefix("Value error, ")
                    issues.append(Issue(where, msg, err.get("input")))
            raise SpecError(issues) from None

    def packed_batch(self, batch_size: int, generator: torch.Generator | None = None):
        """A batch whose rows hold documents, with where each document starts (tasks that
        declare `packs_documents`)."""
        raise NotImplementedError(f"task {self.name!r} has no documents to pack")

    def derive(self, **overrides: Any) -> "Task":
        """The same task with some params changed (validated again), e.g. ``seq_len``."""
        return type(self)({**self.params.model_dump(), **overrides})

    # -- what the trainer reads ------------------------------------------------------------------
    @property
    @abstractmethod
    def vocab_size(self) -> int:
        """Number of token ids the model's embedding and head must cover."""

    @property
    def seq_len(self) -> int:
        """T, the length of every row of ``inputs`` and ``targets``."""
        return int(self.params.seq_len)  # type: ignore[attr-defined]

    def describe(self) -> str:
        """One line for logs: the name and the resolved params."""
        items = ", ".join(f"{k}={v!r}" for k, v in self.params.model_dump().items())
        return f"{self.name}({items})"

    def batch(
        self, batch_size: int, generator: torch.Generator | None = None
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Draw ``batch_size`` rows: ``(inputs [B, T], targets [B, T])``, both int64 on the CPU.

        ``generator`` is a CPU ``torch.Generator``; None uses torch's global generator (not
        reproducible unless the caller seeds it).
        """
        if isinstance(batch_size, bool) or not isinstance(batch_size, int) or batch_size < 1:
            raise ValueError(f"batch_size must be a positive int (got {batch_size!r})")
        if generator is not None:
            if not isinstance(generator, torch.Generator):
                raise ValueError(
                    f"generator must be a torch.Generator or None (got {type(generator).__name__})"
                )
            if generator.device.type != "cpu":
                raise ValueError(
                    f"generator must live on the CPU (got device {generator.device}); tasks draw "
                    "on the CPU and the trainer moves the batch"
                )
        return self._sample(batch_size, generator)

    @abstractmethod
    def _sample(
        self, batch_size: int, generator: torch.Generator | None
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Subclasses draw the batch here (arguments already checked)."""


# -- helpers shared by the synthetic tasks ------------------------------------------------------
def distinct_ints(
    rows: int, count: int, low: int, high: int, generator: torch.Generator | None
) -> torch.Tensor:
    """``[rows, count]`` ints from ``[low, high)``, distinct within each row, in random order.

    The ``count`` largest of i.i.d. uniform scores per row: a uniform random ``count``-subset in
    uniform random order (the first ``count`` of a random permutation, without sorting it all).
    """
    scores = torch.rand(rows, high - low, generator=generator)
    return scores.topk(count, dim=-1, sorted=True).indices + low


def masked_accuracy(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """Argmax accuracy over the positions whose target is not `IGNORE_INDEX`.

    logits: ``[B, T, V]``; targets: ``[B, T]``. Returns a 0-dim float tensor (nan when no
    position counts).
    """
    keep = targets != IGNORE_INDEX
    hits = (logits.argmax(dim=-1) == targets) & keep
    return hits.sum().float() / keep.sum().float()
