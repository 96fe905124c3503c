"""Context parallelism for a whole language model: every rank holds one time slice of each sequence.

`enable(model, group)` makes each memory layer of a model whose class declares
`MemoryLM.context_parallel` (``core:lm`` / ``titans:lmm``: its memory layers are the only layers
that mix tokens) run across the ranks of ``group``:

- the layer's rule call goes through `context_parallel` (the rule's state crosses the slice
  boundaries; gradients come back);
- the layer's short causal convolutions take as their carried inputs the last ``kernel - 1``
  inputs of the previous rank's slice (a differentiable all-gather), where a single process would
  have had them in the same sequence.

Everything else (embedding, norms, MLPs, the head) works token by token. With `enable` on, a
forward of the model on rank r's slice ``ids[:, T_r]`` gives the logits of those positions of
the whole-sequence forward. `disable` (or the `off` context) restores the plain layers, e.g. for
an evaluation of whole sequences. Hooks only: parameters and checkpoints are unchanged.
"""

from __future__ import annotations

import contextlib
from typing import Any

import torch
import torch.distributed as dist

from ..errors import Issue, SpecError
from .context import context_parallel, mode_for

_MARK = "_context_parallel"


def _rotary_refused() -> SpecError:
    return SpecError([Issue(
        "layer.rotary", "context parallelism runs each slice from position 0, and rotary q/k need "
        "each token's absolute position", True,
        "train this model without --context-parallel, or set layer.rotary = false")])


def check_model(spec: Any, ranks: int, seq_len: int) -> None:
    """Refuse a model or sequence length context parallelism cannot split (one clear error). The
    model is built on the meta device (no memory) to read its `context_parallel`."""
    from ..model import build_model

    with torch.device("meta"):
        model = build_model(spec)
    if not model.context_parallel:
        arch = spec.model.get("arch")
        layers = spec.model.get("layers")
        if layers and "attention" in layers:
            raise SpecError([Issue(
                "model.layers", "--context-parallel splits sequences across memory layers only, and "
                "this model's softmax-attention blocks mix tokens across the whole sequence", layers,
                "train this hybrid without --context-parallel")])
        raise SpecError([Issue(
            "model.arch", f"--context-parallel splits sequences across memory layers only "
            f"(core:lm, titans:lmm); {arch} also mixes tokens across time in other layers", arch,
            "train this architecture without --context-parallel")])
    layer = spec.layer if isinstance(getattr(spec, "layer", None), dict) else {}
    if layer.get("rotary"):
        raise _rotary_refused()
    carried = max(int(layer.get("conv_size", 4)) - 1, 1)  # the convolution's carried inputs
    if seq_len // ranks < carried:
        raise SpecError([Issue("train.seq_len", f"a sequence of {seq_len} tokens split over "
                               f"{ranks} ranks leaves slices shorter than the {carried} inputs "
                               "a slice hands to the next", seq_len,
                               f"use seq_len >= {ranks * carried}")])


def time_slice(t: torch.Tensor, rank: int, world: int) -> torch.Tensor:
    """Rank ``rank``'s consecutive piece of ``t [B, T, ...]`` along time (``tensor_split``)."""
    return t.tensor_split(world, dim=1)[rank]


class _Gather(torch.autograd.Function):
    """All-gather of one tensor a rank, differentiable: the gradient of a rank's tensor is the sum
    over ranks of the gradients of its gathered copies."""

    @staticmethod
    def forward(ctx, x, group):
        ctx.group = group
        out = [torch.empty_like(x) for _ in range(dist.get_world_size(group))]
        dist.all_gather(out, x.contiguous(), group=group)
        return torch.stack(out)

    @staticmethod
    def backward(ctx, grad):
        grad = grad.contiguous().clone()
        dist.all_reduce(grad, group=ctx.group)
        return grad[dist.get_rank(ctx.group)], None


def _halo(x: torch.Tensor, n: int, group) -> torch.Tensor | None:
    """The last ``n`` time steps of the previous rank's ``x [B, T, C]`` (zeros on the first rank),
    differentiable: the gradient goes back to the rank that holds them."""
    rank = dist.get_rank(group)
    tail = x[:, -n:] if x.shape[1] >= n else torch.cat(
        [x.new_zeros(x.shape[0], n - x.shape[1], x.shape[2]), x], dim=1)
    every = _Gather.apply(tail, group)
    # the first rank starts from zeros; it still takes the gathered tensor (times 0) so that
    # every rank's backward runs the gather's backward, a collective all ranks must join
    return every[max(rank - 1, 0)] * (1.0 if rank else 0.0)


def enable(model: torch.nn.Module, group=None, mode: str = "auto") -> int:
    """Route every memory layer of ``model`` through context parallelism over ``group`` (default:
    the whole world). Returns the number of layers changed."""
    from ..layer import MemoryLayer

    group = group if group is not None else dist.group.WORLD
    count = 0
    for layer in model.modules():
        if not isinstance(layer, MemoryLayer) or _MARK in layer.__dict__:
            continue
        if layer.params.rotary:
            raise _rotary_refused()
        rule = layer.rule
        mode_for(rule, mode)  # an unknown or impossible mode fails here, before any run
        hooks = []
        for conv in (layer.q_conv, layer.k_conv, layer.v_conv) if layer.use_conv else ():
            def pre(module, args, _n=conv.kernel - 1):
                x, cache = args
                if cache is None and _n > 0:
                    cache = _halo(x, _n, group)
                return (x, cache)

            hooks.append(conv.register_forward_pre_hook(pre))

        def forward(q, k, v, gates=None, state=None, strategy=None, _rule=rule):
            return context_parallel(_rule, q, k, v, gates, state, group=group, strategy=strategy,
                                    mode=mode)

        rule.forward = forward  # an instance attribute: the class's forward runs inside
        setattr(layer, _MARK, {"hooks": hooks, "group": group, "mode": mode})
        count += 1
    return count


def disable(model: torch.nn.Module) -> None:
    """Undo `enable`."""
    for layer in model.modules():
        mark = layer.__dict__.pop(_MARK, None)
        if mark is None:
            continue
        for h in mark["hooks"]:
            h.remove()
        layer.rule.__dict__.pop("forward", None)


@contextlib.contextmanager
def off(model: torch.nn.Module):
    """Run whole sequences in this process for a while (evaluation), then split them again."""
    marks = [m.__dict__[_MARK] for m in model.modules() if _MARK in m.__dict__]
    if marks:
        disable(model)
    try:
        yield model
    finally:
        if marks:
            enable(model, marks[0]["group"], marks[0]["mode"])
