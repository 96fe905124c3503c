"""The ``[train]`` table of a spec: what ``atlas train`` runs, validated like the rest of the spec.

```toml
[train]
task = { use = "mqar", num_pairs = 8, seq_len = 64 }   # or task = "mqar"
steps = 2000
batch_size = 32
lr = 3e-3                      # AdamW peak learning rate
betas = [0.9, 0.95]
weight_decay = 0.1
warmup_steps = 100             # linear warm-up, then cosine decay to min_lr at `steps`
min_lr = 3e-4
grad_clip = 1.0                # global grad-norm clip; 0 disables
eval_every = 100               # 0: evaluate only at the end
eval_batches = 4
log_every = 10
checkpoint_every = 0           # 0: checkpoint only at the end (and on Ctrl-C)
seed = 0
device = "auto"                # auto | cpu | cuda
```

The task is a registered component of kind ``task`` (``core:mqar``, ``core:copy``,
``core:selective_copy``, ``core:sniah``, ``core:text``); its params are validated by the task's
own params model. Two keys are filled by the trainer when the task table leaves them out:
``vocab_size`` (from ``model.vocab_size``, for tasks that take one) and ``seq_len`` (from
``train.seq_len`` when that is set, which overrides the task's own).

`validate_train(raw, path="train")` is what the spec loader calls: it returns the resolved table
(every default filled, the task as ``{"use": "core:<name>", **its params}``) or raises one
`SpecError` with every problem at its dotted path.
"""

from __future__ import annotations

import math
from typing import Any, Literal, Mapping

from pydantic import Field, ValidationError, field_validator, model_validator

from ..errors import Issue, SpecError, did_you_mean
from ..host.registry import Params, split_use


class TrainParams(Params):
    """The trainer's options (see the module docstring for the TOML form)."""

    task: Any = Field("mqar", description="task name or {use = name, ...task params}")
    steps: int = Field(1000, ge=1, description="optimizer steps in the whole run")
    batch_size: int = Field(32, ge=1, description="rows per step (the global batch)")
    seq_len: int | None = Field(None, ge=2, description="overrides the task's seq_len when set")
    lr: float = Field(3e-3, gt=0, description="AdamW peak learning rate")
    betas: list[float] = Field(default_factory=lambda: [0.9, 0.95], description="AdamW betas")
    eps: float = Field(1e-8, gt=0, description="AdamW epsilon")
    weight_decay: float = Field(0.1, ge=0, description="AdamW decoupled weight decay")
    warmup_steps: int = Field(100, ge=0, description="linear warm-up steps")
    min_lr: float = Field(3e-4, ge=0, description="learning rate at the end of the cosine")
    grad_clip: float = Field(1.0, ge=0, description="max global gradient norm; 0 disables")
    eval_every: int = Field(100, ge=0, description="evaluate every N steps; 0: only at the end")
    eval_batches: int = Field(4, ge=1, description="batches per evaluation")
    log_every: int = Field(10, ge=1, description="write a train record every N steps")
    checkpoint_every: int = Field(0, ge=0, description="checkpoint every N steps; 0: at the end")
    keep_checkpoints: int = Field(2, ge=1, description="complete checkpoints kept in a run")
    seed: int = Field(0, ge=0, description="seeds the model init and the data")
    device: Literal["auto", "cpu", "cuda"] = Field("auto", description="where to train")

    @field_validator("betas")
    @classmethod
    def _betas(cls, betas: list[float]) -> list[float]:
        if len(betas) != 2 or not all(0.0 <= b < 1.0 for b in betas):
            raise ValueError(f"betas must be two numbers in [0, 1), e.g. [0.9, 0.95]; got {betas}")
        return [float(b) for b in betas]

    @field_validator("lr", "min_lr", "grad_clip", "weight_decay", "eps")
    @classmethod
    def _finite(cls, x: float) -> float:
        if not math.isfinite(x):
            raise ValueError(f"must be a finite number, got {x}")
        return x

    @model_validator(mode="after")
    def _consistent(self) -> "TrainParams":
        if self.min_lr > self.lr:
            raise ValueError(
                f"min_lr={self.min_lr} is above lr={self.lr}; the cosine decays from lr down to "
                "min_lr, so set min_lr <= lr"
            )
        return self

    @property
    def task_name(self) -> str:
        return split_use(self.task)[0]

    @property
    def task_params(self) -> dict[str, Any]:
        return split_use(self.task)[1]


def _task_hint(name: str, names: list[str]) -> str:
    short = [n.split(":", 1)[1] for n in names]
    hint = did_you_mean(name.split(":", 1)[-1], short)
    return (hint + " " if hint else "") + f"tasks: {', '.join(short)}"


def resolve_task(value: Any, path: str = "train.task", registry=None) -> dict[str, Any]:
    """``"mqar"`` or ``{use = "mqar", ...}`` -> ``{"use": "core:mqar", ...}`` with the params
    validated by the task's params model (kept as given: the trainer fills vocab_size/seq_len)."""
    from ..errors import UnknownComponentError

    if registry is None:
        from ..host.manager import get_registry

        registry = get_registry()
    name, raw = split_use(value, path)
    where = f"{path}.use" if isinstance(value, Mapping) else path
    try:
        comp = registry.get("task", name, where)
    except UnknownComponentError:
        names = registry.names("task")
        raise SpecError([Issue(where, "unknown task", name, _task_hint(name, names))]) from None
    comp.validate(raw, path)
    return {"use": comp.name, **raw}


def validate_train(raw: Mapping[str, Any] | None, path: str = "train", registry=None) -> dict:
    """Validate a ``[train]`` table; returns the resolved mapping (see the module docstring)."""
    if raw is None:
        raw = {}
    if not isinstance(raw, Mapping):
        raise SpecError([Issue(path, "must be a table", type(raw).__name__)])
    issues: list[Issue] = []
    try:
        params = TrainParams.model_validate(dict(raw))
    except ValidationError as exc:
        fields = list(TrainParams.model_fields)
        for err in exc.errors():
            loc = ".".join(str(p) for p in err["loc"])
            where = f"{path}.{loc}" if loc else path
            if err["type"] == "extra_forbidden":
                key = str(err["loc"][-1])
                hint = did_you_mean(key, fields) or f"allowed keys: {', '.join(fields)}"
                issues.append(Issue(where, "unknown key", None, hint))
            else:
                msg = err["msg"].removeprefix("Value error, ")
                value = err.get("input") if err["loc"] else None
                issues.append(Issue(where, msg, value))
        params = None
    task_value = raw.get("task", "mqar")
    task: dict[str, Any] | None = None
    try:
        task = resolve_task(task_value, f"{path}.task", registry)
    except SpecError as exc:
        issues.extend(exc.issues)
    if issues:
        raise SpecError(issues)
    assert params is not None and task is not None  # both succeeded when no issue was recorded
    out = params.model_dump()
    out["task"] = task
    if out["seq_len"] is None:
        del out["seq_len"]  # TOML has no null; absent means "the task's own"
    return out


def train_params(raw: Mapping[str, Any] | TrainParams | None, path: str = "train") -> TrainParams:
    """A `TrainParams` from a raw or resolved table (validated, task resolved)."""
    if isinstance(raw, TrainParams):
        return raw
    return TrainParams.model_validate(validate_train(raw, path))
