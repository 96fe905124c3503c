"""One optimizer step of training, on this rank's rows of the global batch.

``loss = sum CE(logits, targets) / (global count of targets != -100)``; backward; gradients
summed over processes (DDP and FSDP average them over the N ranks, so N times the loss is
back-propagated); global-norm clipping at ``grad_clip``; ``optimizer.step()``. With
``precision = "bf16"`` the forward pass runs under ``torch.autocast(dtype=torch.bfloat16)``; the
loss is computed in float32.
"""

from __future__ import annotations

import contextlib
import math
from typing import Any, Callable

import torch
import torch.nn.functional as F

from .data_parallel import DistInfo, all_reduce_sum, full_value
from .tasks import IGNORE_INDEX


def autocast_for(precision: str, device: str):
    """The context of a training forward pass: bf16 autocast, or nothing (fp32)."""
    if precision != "bf16":
        return contextlib.nullcontext()
    return torch.autocast(device.split(":")[0], dtype=torch.bfloat16)


def optimizer_step(forward: Callable[..., torch.Tensor], params: list[torch.Tensor],
                   optimizer: torch.optim.Optimizer, inputs: torch.Tensor, targets: torch.Tensor,
                   starts: torch.Tensor | None, *, dist: DistInfo, grad_clip: float,
                   autocast: Any) -> dict[str, float]:
    """One step (module docstring); returns the global loss, accuracy and gradient norm.
    ``starts`` (``[train] pack``): where documents begin in each row; the rows then run as one
    packed row with ``cu_seqlens`` (`atlas_core.varlen`), each document as if alone."""
    with autocast:
        if starts is None:
            logits = forward(inputs)
        else:
            from ..varlen import pack_rows

            row, cu = pack_rows(inputs, starts)
            logits = forward(row, cu_seqlens=cu).reshape(*inputs.shape, -1)
    logits = logits.float()  # [b, T, V]
    keep = targets != IGNORE_INDEX
    ce = F.cross_entropy(logits.flatten(0, 1), targets.flatten(),
                         ignore_index=IGNORE_INDEX, reduction="sum")
    hits = ((logits.detach().argmax(-1) == targets) & keep).sum()
    counts = all_reduce_sum(torch.stack([keep.sum(), hits]).double(), dist)
    total = counts[0].clamp_min(1.0)
    loss = ce / total.to(ce.dtype)
    optimizer.zero_grad(set_to_none=True)
    # DDP and FSDP average the gradients over ranks: N times the loss makes that the sum
    (loss * dist.world if dist.active else loss).backward()
    clip = grad_clip if grad_clip > 0 else math.inf
    grad_norm = torch.nn.utils.clip_grad_norm_(params, clip)
    optimizer.step()
    report = all_reduce_sum(loss.detach().double().reshape(1), dist)
    return {"loss": float(report.item()), "accuracy": float(counts[1] / total),
            "grad_norm": float(full_value(grad_norm))}
