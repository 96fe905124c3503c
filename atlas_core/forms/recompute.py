"""Bounded training memory for chunked strategies: recompute chunks (and segments of chunks) in
the backward pass instead of keeping their intermediates (docs/math.md, "Training memory of the
chunked strategies").

A chunked strategy is a scan ``carry_{i+1}, y_i = body(i, carry_i, inputs_i)`` over N chunks, the
carry being the memory state at a chunk boundary (weights, optimiser state, anchor). `scan` runs
it in one of three ways, all with the same outputs and gradients:

- **plain**: autograd keeps every chunk's intermediates (for Muon on a deep memory: the momenta,
  the Newton–Schulz iterates and the per-token weights, O(C k |W|) per chunk);
- **per chunk** (``per_chunk = True``): each chunk runs without keeping its intermediates; its
  inputs, the carry at its start included, are kept, and the backward pass recomputes the chunk
  from them. Kept: N boundary states plus one chunk's working set during the backward pass. Cost:
  one more forward of every chunk;
- **segments** (``segment = S > 1``): the chunks are grouped into segments of S chunks, and only
  the carry at each segment's start is kept; the backward pass recomputes a segment (its chunks as
  above, keeping S boundary states), then runs the segment's backward. Kept: N / S + S boundary
  states (about 2 sqrt(N) at ``S = ceil(sqrt(N))``). Cost: one more forward of every chunk again.

`Recompute` is hand-written instead of `torch.utils.checkpoint`: the non-reentrant checkpoint
relies on saved-tensor hooks, which ``torch.func`` transforms (used by deep memories such as
``titans:mlp`` for their inner gradients) refuse, and the reentrant one does not support
``torch.autograd.grad``. It is first-order only (``once_differentiable``): switch recomputation off
for double backward.
"""

from __future__ import annotations

import math
from typing import Callable, Sequence

import torch
from torch.autograd.function import once_differentiable

Carry = dict  # {name: tensor}, a fixed key order
Body = Callable[[int, Carry, dict], tuple[torch.Tensor, Carry]]


class Recompute(torch.autograd.Function):
    """Run ``fn(*inputs) -> tuple of tensors`` without keeping its intermediates; recompute them
    in the backward pass. ``extra`` tensors (the rule's learned parameters) are used by ``fn``
    through the module that owns them; listing them makes their gradients flow."""

    @staticmethod
    def forward(ctx, fn: Callable, n_inputs: int, *tensors: torch.Tensor):
        ctx.fn, ctx.n_inputs = fn, n_inputs
        ctx.save_for_backward(*tensors)
        with torch.no_grad():
            return tuple(fn(*tensors[:n_inputs]))

    @staticmethod
    @once_differentiable
    def backward(ctx, *grads: torch.Tensor):
        tensors = ctx.saved_tensors
        needs = ctx.needs_input_grad[2:]
        n = ctx.n_inputs
        inputs = [x.detach().requires_grad_(need) for x, need in zip(tensors[:n], needs[:n])]
        with torch.enable_grad():
            outs = ctx.fn(*inputs)
        wrt = [x for x, need in zip(inputs + list(tensors[n:]), needs) if need]
        pairs = [(o, g) for o, g in zip(outs, grads) if o.requires_grad and g is not None]
        got = iter(())
        if wrt and pairs:
            got = iter(torch.autograd.grad(
                [o for o, _ in pairs], wrt, [g for _, g in pairs], allow_unused=True
            ))
        return (None, None, *[next(got) if need else None for need in needs])


def recompute(fn: Callable, inputs: Sequence[torch.Tensor], extra: Sequence[torch.Tensor] = ()):
    """``fn(*inputs)`` (a tuple of tensors) with its intermediates recomputed in the backward."""
    return Recompute.apply(fn, len(inputs), *inputs, *extra)


def segment_size(n_chunks: int, carry_bytes: int, budget_mib: float | None) -> int:
    """Chunks per recomputed segment: 1 (every chunk boundary kept) while ``n_chunks`` boundary
    states of ``carry_bytes`` fit in ``budget_mib``, else ``ceil(sqrt(n_chunks))``. None: no
    budget (always 1)."""
    if budget_mib is None or n_chunks < 4 or n_chunks * carry_bytes <= budget_mib * 2**20:
        return 1
    return math.isqrt(n_chunks - 1) + 1


def carry_bytes(carry: Carry) -> int:
    """Bytes of one boundary state (tensors sharing a storage counted once)."""
    seen, total = set(), 0
    for x in carry.values():
        key = x.untyped_storage().data_ptr()
        if key not in seen:
            seen.add(key)
            total += x.numel() * x.element_size()
    return total


def _fresh(carry: Carry) -> Carry:
    """A chunk's output carry owns its storage: a view into a chunk's per-token tensor (the last
    token's weights) would keep the whole ``[B, H, C, ...]`` tensor alive as long as the view."""
    return {k: x if x.is_contiguous() and x.untyped_storage().nbytes() == x.numel() * x.element_size()
            else x.clone() for k, x in carry.items()}


def scan(body: Body, carry: Carry, inputs: Sequence[dict], *, per_chunk: bool, segment: int = 1,
         params: Sequence[torch.Tensor] = ()) -> tuple[list[torch.Tensor], Carry]:
    """Run ``body`` over the chunks (see module docstring): returns the per-chunk outputs (one
    tensor per chunk, or per segment: ``[B, H, n, ...]``, joined on dim 2) and the final carry.
    ``inputs[i]`` is chunk i's ``{name: tensor}``; ``params`` the learned tensors ``body`` reads
    through its module. The carry a chunk returns may leave out entries the next chunk does not
    read (so that they are not kept for the backward pass)."""
    if not torch.is_grad_enabled() or (not per_chunk and segment <= 1):
        ys = []
        for i, inp in enumerate(inputs):
            y, carry = body(i, carry, inp)
            ys.append(y)
        return ys, carry
    params = [p for p in params if p.requires_grad]

    def checkpointed(fn, carry: Carry, flat: list) -> tuple[torch.Tensor, Carry]:
        """``fn(carry, *flat) -> (y, carry)`` through `recompute`; the output carry's keys are
        read from the forward run (the recomputation gives the same)."""
        keys, out_keys = list(carry), []

        def run(*t):
            y, out = fn(dict(zip(keys, t[: len(keys)])), *t[len(keys):])
            out_keys[:] = list(out)
            return (y, *_fresh(out).values())

        out = recompute(run, [*carry.values(), *flat], params)
        return out[0], dict(zip(out_keys, out[1:]))

    def chunk(i: int, c: Carry, inp: dict) -> tuple[torch.Tensor, Carry]:
        if not per_chunk:
            return body(i, c, inp)
        names = list(inp)
        return checkpointed(lambda c, *t: body(i, c, dict(zip(names, t))), c, list(inp.values()))

    if segment <= 1:
        ys = []
        for i, inp in enumerate(inputs):
            y, carry = chunk(i, carry, inp)
            ys.append(y)
        return ys, carry

    ys = []
    for s0 in range(0, len(inputs), segment):
        idx = range(s0, min(s0 + segment, len(inputs)))
        names = [list(inputs[i]) for i in idx]

        def run_segment(c, *t, idx=idx, names=names):
            rest, ys_s = iter(t), []
            for i, nm in zip(idx, names):  # the chunk inputs as this recomputation received them
                y, c = chunk(i, c, {n: next(rest) for n in nm})
                ys_s.append(y)
            return torch.cat(ys_s, dim=2), c

        y, carry = checkpointed(run_segment, carry, [x for i in idx for x in inputs[i].values()])
        ys.append(y)
    return ys, carry
