"""Train several specs on one task setting and tabulate them (``atlas compare``).

Every spec is trained with the same task, steps, batch size and seed (overriding its ``[train]``
table), each in its own run directory, and one row is reported per spec:

- ``rule``: the memory's knobs, ``bias+algorithm[+retention]`` (e.g. ``l2+gd`` is the delta rule,
  ``dot+gd`` the Hebbian / linear-attention rule), or the standalone rule's name;
- ``memory`` / ``state``: floats per memory layer and sequence — ``memory`` counts the memory
  ``M`` itself, ``state`` everything the rule carries (momentum ``Z`` included), measured by
  running each memory layer on one token and counting its rule state (convolution caches are not
  counted: they do not depend on the rule);
- ``params``, ``accuracy`` (held-out, at the end), ``eval_loss``, ``time_s`` (training wall time).

Without ``out`` the runs live in a temporary directory that is removed after the table is made;
the training lines call it ``<scratch>`` (``--out DIR`` keeps the runs and names their paths).

Zoology (Arora et al. 2023) predicts that at equal state size l2 (delta-rule) memories recall far
better than dot-product (Hebbian) ones; the table shows whatever the runs give.
"""

from __future__ import annotations

import contextlib
import copy
import sys
import tempfile
from pathlib import Path
from typing import Any, Callable

import torch

from ..errors import Issue, SpecError


def rule_label(memory: dict[str, Any]) -> str:
    """``l2+gd``, ``l2+momentum+decay``, ... from a resolved ``[memory]`` table."""
    def short(v: Any) -> str:
        name = v.get("use") if isinstance(v, dict) else v
        return str(name).split(":", 1)[-1]

    if "bias" not in memory:
        return short(memory.get("use", "?"))
    parts = [short(memory["bias"]), short(memory["algorithm"])]
    retention = short(memory.get("retention", "none"))
    if retention != "none":
        parts.append(retention)
    structure = short(memory.get("structure", "linear"))
    label = "+".join(parts)
    return label if structure == "linear" else f"{label} ({structure})"


@torch.no_grad()
def state_sizes(model: torch.nn.Module) -> dict[str, int]:
    """Rule-state floats per memory layer for one sequence (see the module docstring)."""
    from ..layer import MemoryLayer

    layers = [m for m in model.modules() if isinstance(m, MemoryLayer)]
    if not layers:
        return {"memory_layers": 0, "memory": 0, "state": 0}
    layer = layers[0]
    param = next(layer.parameters())
    x = torch.zeros(1, 1, layer.d_model, dtype=param.dtype, device=param.device)
    _, st = layer(x)
    rule = {k: v for k, v in st.items() if k.startswith("rule.") and isinstance(v, torch.Tensor)}
    memory = sum(v.numel() for k, v in rule.items() if k == "rule.M")
    return {"memory_layers": len(layers), "memory": memory or sum(v.numel() for v in rule.values()),
            "state": sum(v.numel() for v in rule.values())}


def compare(
    specs: list[str | Path | dict],
    *,
    task: Any = None,
    steps: int | None = None,
    batch_size: int | None = None,
    seed: int = 0,
    out: str | Path | None = None,
    progress: bool = False,
    on_row: Callable[[dict[str, Any]], None] | None = None,
) -> list[dict[str, Any]]:
    """Train each spec under the same setting; returns one row per spec (module docstring)."""
    from ..spec import load_spec
    from .params import resolve_task

    if not specs:
        raise ValueError("give at least one spec to compare")
    if task is not None:
        resolve_task(task, "--task")  # an unknown task fails before anything trains
    loaded = []
    for s in specs:
        spec = load_spec(Path(s) if isinstance(s, (str, Path)) else s)
        data = spec.to_dict()
        trained = copy.deepcopy(data.get("train") or {})
        if task is not None:
            trained["task"] = task
        for key, value in (("steps", steps), ("batch_size", batch_size)):
            if value is not None:
                trained[key] = value
        trained["seed"] = seed
        trained["eval_every"] = 0
        data["train"] = trained
        loaded.append(load_spec(data))
    tasks = {str(sp.train["task"]) for sp in loaded}
    if len(tasks) > 1:
        raise SpecError([Issue("train.task", "the specs train on different tasks; pass --task to "
                               "compare them on one", sorted(tasks)[0])])
    if out is not None:
        return _train_all(loaded, Path(out), progress, on_row, keep=True)
    with tempfile.TemporaryDirectory(prefix="atlas-compare-") as scratch:
        # without `out` the runs are scratch, removed once the table is made: the trainer's lines
        # name them <scratch>/..., not paths that will not exist
        with contextlib.redirect_stderr(_Renamed(sys.stderr, scratch, SCRATCH)):
            return _train_all(loaded, Path(scratch), progress, on_row, keep=False)


#: what the trainer's lines call the temporary folder of a comparison without ``out``
SCRATCH = "<scratch>"


class _Renamed:
    """A text stream that writes to ``stream`` with ``old`` replaced by ``new``."""

    def __init__(self, stream: Any, old: str, new: str) -> None:
        self.stream, self.old, self.new = stream, old, new

    def write(self, text: str) -> int:
        self.stream.write(text.replace(self.old, self.new))
        return len(text)

    def __getattr__(self, name: str) -> Any:  # flush, isatty, fileno, encoding, ...
        return getattr(self.stream, name)


def _train_all(loaded, root: Path, progress: bool, on_row, keep: bool) -> list[dict[str, Any]]:
    from ..model import build_model
    from .setup import TrainOptions
    from .launch import train

    rows = []
    for i, spec in enumerate(loaded):
        run_dir = root / f"{i + 1:02d}-{spec.name}"
        result = train(TrainOptions(spec=spec.to_dict(), out=str(run_dir), progress=progress))
        sizes = state_sizes(build_model(spec))
        row = {
            "name": spec.name,
            "rule": rule_label(spec.memory),
            **sizes,
            "params": result["params"],
            "accuracy": result["accuracy"],
            "eval_loss": result["eval_loss"],
            "time_s": result["time_s"],
            "steps": result["steps"],
            "task": result["task"],
            "run_dir": result["run_dir"] if keep else None,
        }
        rows.append(row)
        if on_row is not None:
            on_row(row)
    return rows


def markdown_table(rows: list[dict[str, Any]]) -> str:
    """The rows as a Markdown table (what docs/mqar_comparison.md holds)."""
    head = ("| spec | rule | memory floats / layer | state floats / layer | params | accuracy "
            "| eval loss | time (s) |\n|---|---|---:|---:|---:|---:|---:|---:|\n")
    body = "".join(
        f"| {r['name']} | {r['rule']} | {r['memory']:,} | {r['state']:,} | {r['params']:,} | "
        f"{r['accuracy']:.3f} | {r['eval_loss']:.3f} | {r['time_s']:.0f} |\n" for r in rows
    )
    return head + body
