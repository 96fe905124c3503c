"""The optimiser and the learning-rate schedule, and the optimiser state as named tensors.

- `build_optimizer`: AdamW (Loshchilov & Hutter 2019) with decoupled weight decay on matrices
  only (``p.dim() >= 2``); biases, norm weights and gate vectors are not decayed (the usual GPT
  practice: decaying a norm's gain towards 0 fights the normalisation);
- `lr_at(step)`: linear warm-up over ``warmup_steps`` (step ``s`` uses ``lr * (s + 1) / warmup``),
  then a half cosine from ``lr`` down to ``min_lr`` at the last step. A pure function of the step,
  so resuming needs no scheduler state;
- `optimizer_tensors` / `load_optimizer_tensors`: the optimiser's ``state_dict`` as a flat mapping
  of named tensors (``"<param name>/<state key>"``, e.g. ``"blocks.0.mlp.up.weight/exp_avg"``) plus
  a JSON-able mapping of everything else (param groups with parameter *names* instead of indices,
  non-tensor state values). Safetensors holds the first, JSON the second: no pickle anywhere.
"""

from __future__ import annotations

import math
from typing import Any

import torch
from torch import nn

from .params import TrainParams

SEP = "/"  # parameter names use dots; the state key follows a slash


def lr_at(step: int, p: TrainParams) -> float:
    """Learning rate of optimizer step ``step`` (0-based) of ``p.steps``."""
    if p.warmup_steps and step < p.warmup_steps:
        return p.lr * (step + 1) / p.warmup_steps
    span = max(p.steps - p.warmup_steps - 1, 1)
    progress = min(max(step - p.warmup_steps, 0) / span, 1.0)
    return p.min_lr + 0.5 * (p.lr - p.min_lr) * (1.0 + math.cos(math.pi * progress))


def named_unique_parameters(model: nn.Module) -> list[tuple[str, nn.Parameter]]:
    """``named_parameters`` with tied parameters listed once (under their first name)."""
    return [(n, p) for n, p in model.named_parameters() if p.requires_grad]


def build_optimizer(model: nn.Module, p: TrainParams) -> torch.optim.AdamW:
    decay, no_decay = [], []
    for _, param in named_unique_parameters(model):
        (decay if param.dim() >= 2 else no_decay).append(param)
    groups = [
        {"params": decay, "weight_decay": p.weight_decay},
        {"params": no_decay, "weight_decay": 0.0},
    ]
    # foreach=False: the plain per-parameter loop is the same arithmetic on every device count,
    # which keeps single- and multi-process runs comparable step for step.
    return torch.optim.AdamW(
        groups, lr=p.lr, betas=tuple(p.betas), eps=p.eps, foreach=False
    )


def _param_names(model: nn.Module, optimizer: torch.optim.Optimizer) -> list[str]:
    """The name of every parameter in the optimiser's order (state_dict indices)."""
    by_id = {id(param): name for name, param in named_unique_parameters(model)}
    names = []
    for group in optimizer.param_groups:
        for param in group["params"]:
            names.append(by_id[id(param)])
    return names


def optimizer_tensors(
    model: nn.Module, optimizer: torch.optim.Optimizer
) -> tuple[dict[str, torch.Tensor], dict[str, Any]]:
    """The optimiser state as ``(named tensors, JSON-able rest)``; see the module docstring."""
    sd = optimizer.state_dict()
    names = _param_names(model, optimizer)
    tensors: dict[str, torch.Tensor] = {}
    scalars: dict[str, dict[str, Any]] = {}
    for index, state in sd["state"].items():
        name = names[index]
        for key, value in state.items():
            if isinstance(value, torch.Tensor):
                tensors[f"{name}{SEP}{key}"] = value.detach().cpu().contiguous().clone()
            else:
                scalars.setdefault(name, {})[key] = value
    groups = []
    for group in sd["param_groups"]:
        g = {k: (list(v) if isinstance(v, tuple) else v) for k, v in group.items() if k != "params"}
        g["params"] = [names[i] for i in group["params"]]
        groups.append(g)
    return tensors, {"param_groups": groups, "scalars": scalars}


def load_optimizer_tensors(
    model: nn.Module,
    optimizer: torch.optim.Optimizer,
    tensors: dict[str, torch.Tensor],
    rest: dict[str, Any],
) -> None:
    """Inverse of `optimizer_tensors`: restore the state into ``optimizer`` (built for ``model``).

    Raises ValueError naming the first parameter that does not match."""
    names = _param_names(model, optimizer)
    index = {name: i for i, name in enumerate(names)}
    groups = rest.get("param_groups", [])
    if len(groups) != len(optimizer.param_groups):
        raise ValueError(
            f"the checkpoint's optimiser has {len(groups)} parameter groups, this model's has "
            f"{len(optimizer.param_groups)}"
        )
    sd_groups = []
    for saved, live in zip(groups, optimizer.param_groups):
        params = saved.get("params", [])
        missing = [n for n in params if n not in index]
        if missing:
            raise ValueError(f"the checkpoint's optimiser has state for unknown parameter {missing[0]!r}")
        if len(params) != len(live["params"]):
            raise ValueError(
                f"the checkpoint's optimiser group holds {len(params)} parameters, this model's "
                f"holds {len(live['params'])}"
            )
        g = {k: (tuple(v) if k == "betas" else v) for k, v in saved.items() if k != "params"}
        g["params"] = [index[n] for n in params]
        sd_groups.append(g)
    state: dict[int, dict[str, Any]] = {}
    for key, value in tensors.items():
        name, _, skey = key.rpartition(SEP)
        if name not in index:
            raise ValueError(f"the checkpoint's optimiser has state for unknown parameter {name!r}")
        state.setdefault(index[name], {})[skey] = value
    for name, values in rest.get("scalars", {}).items():
        if name not in index:
            raise ValueError(f"the checkpoint's optimiser has state for unknown parameter {name!r}")
        state.setdefault(index[name], {}).update(values)
    optimizer.load_state_dict({"state": state, "param_groups": sd_groups})


def set_lr(optimizer: torch.optim.Optimizer, lr: float) -> None:
    for group in optimizer.param_groups:
        group["lr"] = lr
