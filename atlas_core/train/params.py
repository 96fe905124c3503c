"""The ``[train]`` table of a spec: what ``atlas train`` runs, validated like the rest of the spec.

```toml
[train]
task = { use = "mqar", num_pairs = 8, seq_len = 64 }   # or task = "mqar"
steps = 2000
batch_size = 32                # rows per forward pass (the global batch over all processes)
grad_accum = 1                 # micro-batches per optimizer step: it sees batch_size x grad_accum rows
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
precision = "fp32"             # fp32 | bf16 (autocast; weights, optimiser and memory state fp32)
compile = false                # torch.compile the model (first steps pay the compilation)
tensorboard = false            # also write TensorBoard events to RUN_DIR/tensorboard
pack = false                   # text task: documents packed with cu_seqlens, loss masked at boundaries
threads = "auto"               # torch intra-op threads per process, or a number (atlas_core.train.threads)
```

The task is a registered component of kind ``task`` (``core:mqar``, ``core:copy``,
``core:selective_copy``, ``core:sniah``, ``core:text``); its params are validated by the task's
own params model. Two keys are filled by the trainer when the task table leaves them out:
``vocab_size`` (from ``model.vocab_size``, for tasks that take one) and ``seq_len`` (from
``train.seq_len`` when that is set, which overrides the task's own).

``TrainParams.model_validate(table)`` (what the spec loader calls) resolves the task through the
registry and raises one `SpecError` with every problem (paths relative to the table);
`train_params(raw, path="train")` does the same with dotted paths.
"""

from __future__ import annotations

import math
from typing import Any, Literal, Mapping

from pydantic import Field, ValidationError, field_validator, model_validator
from ..params import size_field

from ..errors import Issue, SpecError, did_you_mean
from ..host.registry import Params, split_use


class TrainParams(Params):
    """The trainer's options (see the module docstring for the TOML form)."""

    task: Any = Field("mqar", description="task name or {use = name, ...task params}")
    steps: int = size_field(1000, "steps", ge=1, description="optimizer steps in the whole run")
    batch_size: int = size_field(32, "batch", ge=1, description="rows per forward pass (the "
                                 "global batch; a step takes grad_accum of them)")
    grad_accum: int = size_field(1, "batch", ge=1, description="micro-batches of batch_size rows "
                                 "per optimizer step, their gradients accumulated: a step learns "
                                 "from batch_size x grad_accum rows")
    seq_len: int | None = size_field(None, "seq_len", ge=2, description="overrides the task's seq_len when set")
    lr: float = Field(3e-3, gt=0, description="AdamW peak learning rate")
    betas: list[float] = Field(default_factory=lambda: [0.9, 0.95], description="AdamW betas")
    eps: float = Field(1e-8, gt=0, description="AdamW epsilon")
    weight_decay: float = Field(0.1, ge=0, description="AdamW decoupled weight decay")
    warmup_steps: int = size_field(100, "steps", ge=0, description="linear warm-up steps")
    min_lr: float = Field(3e-4, ge=0, description="learning rate at the end of the cosine")
    grad_clip: float = Field(1.0, ge=0, description="max global gradient norm; 0 disables")
    eval_every: int = size_field(100, "steps", ge=0, description="evaluate every N steps; 0: only at the end")
    eval_batches: int = size_field(4, "batch", ge=1, description="batches per evaluation")
    log_every: int = size_field(10, "steps", ge=1, description="write a train record every N steps")
    checkpoint_every: int = size_field(0, "steps", ge=0, description="checkpoint every N steps; 0: at the end")
    keep_checkpoints: int = size_field(2, "steps", ge=1, description="complete checkpoints kept in a run")
    seed: int = Field(0, ge=0, description="seeds the model init and the data")
    device: Literal["auto", "cpu", "cuda"] = Field("auto", description="where to train")
    precision: Literal["fp32", "bf16"] = Field(
        "fp32", description="fp32, or bf16 autocast of the model's matmuls (weights, optimiser "
        "and the memory's state and inner loop stay fp32)")
    compile: bool = Field(False, description="torch.compile the model before training",
                          strict=True)
    tensorboard: bool = Field(False, strict=True, description="also write TensorBoard event "
                              "files to RUN_DIR/tensorboard (needs the tensorboard extra)")
    pack: bool = Field(False, strict=True, description="train on packed documents: each row's "
                       "documents run as if alone (cu_seqlens) and no target is the first token "
                       "of a document (the text task)")
    threads: int | str = Field(
        "auto", description="torch intra-op threads per process: \"auto\" (the idle physical "
        "cores, 1 per process under torchrun; OMP_NUM_THREADS when set) or a number")

    @field_validator("betas")
    @classmethod
    def _betas(cls, betas: list[float]) -> list[float]:
        if len(betas) != 2 or not all(0.0 <= b < 1.0 for b in betas):
            raise ValueError(f"betas must be two numbers in [0, 1), e.g. [0.9, 0.95]; got {betas}")
        return [float(b) for b in betas]

    @field_validator("threads", mode="before")
    @classmethod
    def _threads(cls, x: Any) -> int | str:
        if x == "auto" or (isinstance(x, int) and not isinstance(x, bool) and 1 <= x <= 4096):
            return x
        raise ValueError("must be \"auto\" or a number of threads from 1 to 4096")

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

    @classmethod
    def model_validate(cls, obj: Any, *args: Any, **kwargs: Any) -> "TrainParams":
        """Validate a raw table; the task is resolved through the registry. Every problem is
        collected into one `SpecError` (paths relative to the table)."""
        if isinstance(obj, Mapping) and not args and not kwargs:
            return _resolve(cls, obj)
        return super().model_validate(obj, *args, **kwargs)


def _validate(cls: type[TrainParams], raw: Mapping[str, Any]) -> TrainParams:
    return super(TrainParams, cls).model_validate(dict(raw))


def _task_hint(name: str, names: list[str]) -> str:
    short = [n.split(":", 1)[1] for n in names]
    hint = did_you_mean(name.split(":", 1)[-1], short)
    return (hint + " " if hint else "") + f"tasks: {', '.join(short)}"


def resolve_task(value: Any, path: str = "task", registry=None) -> dict[str, Any]:
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
        names, note = registry.names("task"), registry.unavailable_note(name)
        hint = _task_hint(name, names) + (f"; {note}" if note else "")
        raise SpecError([Issue(where, "unknown task", name, hint)]) from None
    try:
        comp.validate(raw, path)
    except SpecError as exc:  # pydantic's "Value error, " prefix says nothing to a user
        raise SpecError([Issue(i.path, i.message.removeprefix("Value error, "), i.value, i.hint)
                         for i in exc.issues]) from None
    return {"use": comp.name, **raw}


def _issues(exc: ValidationError) -> list[Issue]:
    """Pydantic errors as `Issue`s with paths relative to the [train] table."""
    fields = list(TrainParams.model_fields)
    issues = []
    for err in exc.errors():
        where = ".".join(str(p) for p in err["loc"])
        if err["type"] == "extra_forbidden":
            key = str(err["loc"][-1])
            hint = did_you_mean(key, fields) or f"allowed keys: {', '.join(fields)}"
            issues.append(Issue(where, "unknown key", None, hint))
        else:
            msg = err["msg"].removeprefix("Value error, ")
            issues.append(Issue(where, msg, err.get("input") if err["loc"] else None))
    return issues


def _resolve(cls: type[TrainParams], raw: Mapping[str, Any]) -> TrainParams:
    issues: list[Issue] = []
    base = None
    try:
        base = _validate(cls, {k: v for k, v in raw.items() if k != "task"})
    except ValidationError as exc:
        issues.extend(_issues(exc))
    task = None
    try:
        task = resolve_task(raw.get("task", "mqar"), "task")
    except SpecError as exc:
        issues.extend(exc.issues)
    if issues:
        raise SpecError(issues)
    assert base is not None and task is not None  # both succeeded when no issue was recorded
    return base.model_copy(update={"task": task})


def train_params(raw: Mapping[str, Any] | TrainParams | None, path: str = "train") -> TrainParams:
    """A `TrainParams` from a raw or resolved table (validated, task resolved)."""
    if isinstance(raw, TrainParams):
        return raw
    try:
        return TrainParams.model_validate(raw or {})
    except SpecError as exc:
        raise exc.prefixed(path) from None
