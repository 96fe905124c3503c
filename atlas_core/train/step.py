"""One optimizer step of training, on this rank's rows of the global batch.

``loss = sum CE(logits, targets) / (global count of targets != -100)``; backward; gradients
summed over processes (DDP and FSDP average them over the N ranks, so N times the loss is
back-propagated); global-norm clipping at ``grad_clip``; ``optimizer.step()``. With
``[train] grad_accum = N`` the rows run as N micro-batches whose gradients add up to the whole
batch's, exchanged between processes once, after the last. With ``precision = "bf16"`` the
forward pass runs under ``torch.autocast(dtype=torch.bfloat16)``; the loss is computed in float32.
A routed-expert model with ``[model.moe] aux_loss > 0`` adds its load-balancing loss, taken per
forward pass (each micro-batch on each rank) as transformers takes it, averaged over them
(`atlas_core.moe`); the reported ``loss`` stays the cross-entropy, the balance term is reported
beside it as ``balance_loss``.
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
                   autocast: Any, micro_batches: int = 1,
                   no_sync: Callable[[], Any] | None = None,
                   extra_loss: Callable[[], torch.Tensor | None] | None = None) -> dict[str, float]:
    """One step (module docstring); returns the global loss, accuracy and gradient norm.
    ``starts`` (``[train] pack``): where documents begin in each row; the rows then run as one
    packed row with ``cu_seqlens`` (`atlas_core.varlen`), each document as if alone.

    ``micro_batches`` (``[train] grad_accum``): this rank's rows run as that many equal
    micro-batches, one forward and backward each, their gradients accumulated; the loss of each
    is divided by the count of the whole step's targets, so the accumulated gradient is the one
    of all the rows in one batch. ``no_sync()``: a context in which a backward leaves the
    gradients unsynchronised across processes (DDP's ``no_sync``); every micro-batch but the
    last runs in it, so gradients are exchanged once per step. ``extra_loss()``: a term the
    forward pass left to add (the load-balancing loss, `atlas_core.moe.take_balance_loss`), or
    None."""
    rows = inputs.shape[0]
    if micro_batches < 1 or rows % micro_batches:
        raise ValueError(f"{rows} rows do not split into {micro_batches} equal micro-batches")
    keep_all = targets != IGNORE_INDEX
    counts = all_reduce_sum(keep_all.sum().double().reshape(1), dist)
    total = counts[0].clamp_min(1.0)
    optimizer.zero_grad(set_to_none=True)
    size = rows // micro_batches
    loss_sum = torch.zeros((), dtype=torch.float64, device=inputs.device)
    hits = torch.zeros((), dtype=torch.float64, device=inputs.device)
    extra_sum, extra_seen = torch.zeros((), dtype=torch.float64, device=inputs.device), False
    for i in range(micro_batches):
        part = slice(i * size, (i + 1) * size)
        last = i == micro_batches - 1
        quiet = no_sync() if (no_sync is not None and not last) else contextlib.nullcontext()
        with quiet:
            ce, hit = _micro_batch(forward, inputs[part], targets[part],
                                   None if starts is None else starts[part], autocast)
            loss = ce / total.to(ce.dtype)
            extra = extra_loss() if extra_loss is not None else None
            objective = loss
            if extra is not None:  # the mean over micro-batches and ranks
                share = extra / (micro_batches * (dist.world if dist.active else 1))
                objective = loss + share.to(loss.dtype)
                extra_sum += share.detach().double()
                extra_seen = True
            # DDP and FSDP average the gradients over ranks: N times the loss makes that the sum
            (objective * dist.world if dist.active else objective).backward()
        loss_sum += loss.detach().double()
        hits += hit
    clip = grad_clip if grad_clip > 0 else math.inf
    grad_norm = torch.nn.utils.clip_grad_norm_(params, clip)
    optimizer.step()
    report = all_reduce_sum(torch.stack([loss_sum, hits, extra_sum]), dist)
    out = {"loss": float(report[0].item()), "accuracy": float(report[1] / total),
           "grad_norm": float(full_value(grad_norm))}
    if extra_seen:
        out["balance_loss"] = float(report[2].item())
    return out


def _micro_batch(forward, inputs: torch.Tensor, targets: torch.Tensor,
                 starts: torch.Tensor | None, autocast: Any) -> tuple[torch.Tensor, torch.Tensor]:
    """``(summed cross-entropy, argmax hits)`` of one forward over ``inputs [b, T]``."""
    with autocast:
        if starts is None:
            logits = forward(inputs)
        else:
            from ..varlen import pack_rows

            row, cu = pack_rows(inputs, starts)
            logits = forward(row, cu_seqlens=cu).reshape(*inputs.shape, -1)
    if logits.dtype in (torch.float16, torch.bfloat16):
        logits = logits.float()  # [b, T, V]: the loss in float32 at least (float64 stays)
    keep = targets != IGNORE_INDEX
    ce = F.cross_entropy(logits.flatten(0, 1), targets.flatten(),
                         ignore_index=IGNORE_INDEX, reduction="sum")
    hits = ((logits.detach().argmax(-1) == targets) & keep).sum().double()
    return ce, hits
