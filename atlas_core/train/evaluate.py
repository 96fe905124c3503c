"""Tasks for a model, and evaluation: loss, accuracy and perplexity over counted targets.

`build_task` builds the ``[train]`` task for a model: the task's ``vocab_size`` defaults to the
model's, ``train.seq_len`` overrides the task's, and a task that needs more ids than the model has
is one `SpecError`. `held_out` gives the split to evaluate on (a text task's ``val`` split; the
synthetic tasks draw fresh rows from their own generator anyway).

`evaluate` draws ``batches`` batches from a generator seeded with ``seed + EVAL_SEED_OFFSET`` (the
same rows at every evaluation of a run, and never the training stream), and returns::

    {"loss": mean CE over counted targets, "accuracy": argmax hits / counted targets,
     "perplexity": exp(loss), "tokens": counted targets, "batches": batches}

With data parallelism every rank evaluates its slice of each batch and the sums are all-reduced.

Tensors: ``inputs, targets: LongTensor [B, T]`` from the task; ``logits: [B, T, vocab]``.
"""

from __future__ import annotations

import math
from typing import Any, Mapping

import torch
import torch.nn.functional as F

from ..errors import Issue, SpecError
from ..host.registry import split_use
from .data_parallel import SINGLE, DistInfo, all_reduce_sum, shard
from .tasks import IGNORE_INDEX, Task

EVAL_SEED_OFFSET = 1_000_003


def task_table(task: Any, model_vocab: int, seq_len: int | None = None, registry=None,
               path: str = "train.task") -> dict:
    """``{"use": name, **params}`` with vocab_size / seq_len filled as described above."""
    if registry is None:
        from ..host.manager import get_registry

        registry = get_registry()
    name, raw = split_use(task, path)
    comp = registry.get("task", name, path)
    fields = comp.load_params().model_fields
    raw = dict(raw)
    if "vocab_size" in fields and "vocab_size" not in raw:
        raw["vocab_size"] = model_vocab
    if seq_len is not None:
        if "seq_len" not in fields:
            raise SpecError([Issue(f"{path}.seq_len", f"task {comp.name} has no seq_len", seq_len,
                                   "leave the sequence length out")])
        raw["seq_len"] = seq_len
    return {"use": comp.name, **raw}


def build_task(task: Any, model_vocab: int, seq_len: int | None = None, registry=None,
               path: str = "train.task") -> Task:
    """The task of a ``[train]`` table for a model with ``model_vocab`` ids (see above)."""
    if registry is None:
        from ..host.manager import get_registry

        registry = get_registry()
    table = task_table(task, model_vocab, seq_len, registry, path)
    built = registry.build("task", table, path=path)
    if built.vocab_size > model_vocab:
        raise SpecError([Issue(
            "model.vocab_size",
            f"the task {built.describe()} uses {built.vocab_size} token ids, the model has "
            f"{model_vocab}", model_vocab, f"set model.vocab_size = {built.vocab_size} or more")])
    return built


_FILE_SUFFIXES = ("_path", "_file", "_dir")


def file_params(name: str, registry=None, path: str = "--task") -> tuple[str, ...]:
    """The params of task ``name`` that name local files to read.

    A field says so with ``Field(json_schema_extra={"reads_file": True})`` (the text task's
    ``path``); for tasks that do not mark theirs, a field named ``path`` or ``file``, or ending in
    ``_path``, ``_file`` or ``_dir``, counts too. A checkpoint's values for these are never used
    (`without_file_params`): a file from elsewhere must not choose which local files a command
    reads, or ``atlas eval`` would read any path a forged ``meta.json`` names.
    """
    if registry is None:
        from ..host.manager import get_registry

        registry = get_registry()
    model = registry.get("task", name, path).load_params()
    out = []
    for key, info in getattr(model, "model_fields", {}).items():
        extra = info.json_schema_extra if isinstance(info.json_schema_extra, dict) else {}
        if extra.get("reads_file") or key in ("path", "file") or key.endswith(_FILE_SUFFIXES):
            out.append(key)
    return tuple(out)


def without_file_params(name: str, params: Mapping[str, Any], registry=None,
                        path: str = "--task") -> tuple[dict[str, Any], dict[str, Any]]:
    """``(kept, dropped)``: ``params`` of task ``name`` split into the ones that name no file and
    the ones that do (`file_params`)."""
    files = set(file_params(name, registry, path))
    kept = {k: v for k, v in params.items() if k not in files}
    dropped = {k: v for k, v in params.items() if k in files}
    return kept, dropped


def held_out(task: Task) -> Task:
    """The task to evaluate a trained model on: a text task's ``val`` split when it has one."""
    p = task.params
    if task.name == "text" and p.split == "train" and p.val_fraction > 0:
        try:
            return task.derive(split="val")
        except ValueError:  # the held-out part is shorter than a window: evaluate on train
            return task
    return task


@torch.no_grad()
def evaluate(
    model: torch.nn.Module,
    task: Task,
    *,
    batches: int,
    batch_size: int,
    seed: int,
    device: str | torch.device = "cpu",
    dist: DistInfo = SINGLE,
) -> dict[str, float]:
    """Loss / accuracy / perplexity of ``model`` on ``batches`` fixed batches of ``task``."""
    if batches < 1:
        raise ValueError(f"batches={batches} must be >= 1")
    if batch_size < 1 or batch_size % dist.world:
        raise ValueError(
            f"batch_size={batch_size} must be a positive multiple of the {dist.world} processes"
        )
    was_training = model.training
    model.eval()
    gen = torch.Generator().manual_seed(seed + EVAL_SEED_OFFSET)
    sums = torch.zeros(3, dtype=torch.float64, device=device)  # ce, hits, counted
    try:
        for _ in range(batches):
            inputs, targets = task.batch(batch_size, gen)
            inputs = shard(inputs, dist).to(device)
            targets = shard(targets, dist).to(device)
            logits = model(inputs).float()
            keep = targets != IGNORE_INDEX
            ce = F.cross_entropy(logits.flatten(0, 1), targets.flatten(),
                                 ignore_index=IGNORE_INDEX, reduction="sum")
            hits = ((logits.argmax(-1) == targets) & keep).sum()
            sums += torch.stack([ce.double(), hits.double(), keep.sum().double()])
    finally:
        model.train(was_training)
    all_reduce_sum(sums, dist)
    ce, hits, count = sums.tolist()
    loss = ce / max(count, 1.0)
    return {
        "loss": loss,
        "accuracy": hits / max(count, 1.0),
        "perplexity": math.exp(min(loss, 700.0)),
        "tokens": int(count),
        "batches": batches,
    }
