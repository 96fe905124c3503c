"""``atlas_muon:atlas_parallel``: chunk-parallel training of Muon rules (Atlas Sec 5, Eq 15, 32-34).

Per chunk of C tokens (docs/math.md, "Parallel forms"):

1. every gradient is taken at the chunk's anchor, the memory before the chunk, so the per-token
   (window-weighted) gradients ``G: [B, H, C, *s]`` come from one batched VJP;
2. the momentum recurrence ``Z_t = eta_t Z_{t-1} + G_t`` is a linear scan (its closed form, a
   lower-triangular decay matrix times G: `Muon.momenta`);
3. ``NS_k`` runs on every ``Z_t`` of the chunk in one batched call;
4. the retention recurrence ``M_t = alpha_t M_{t-1} - theta_t N_t`` is a second scan;
5. the reads ``y_t = M_t(phi(q_t))`` (or ``M_{t-1}`` with ``read = "before"``) are per token.

Chunk size 1 equals ``core:sequential`` exactly; chunk size C equals the rule's reference loop
with ``anchor_every = C``. The memory, the momenta and the Omega window buffer are carried across
chunks and calls (the chunk grid restarts at each call, as for ``core:chunkwise``).

Memory. The forward transient is O(C |W|) per chunk, never O(T |W|). What autograd keeps for the
backward pass is the larger cost: every chunk's momenta and NS iterates, O(T k |W|) over the
sequence. With ``checkpoint = true`` (the default) each chunk is recomputed during the backward
pass from its inputs instead, so only the chunk-boundary states are kept — O((T / C) |W| + C k |W|)
— at the price of running each chunk's forward twice. Results and gradients are identical.

The per-chunk code is ``core:chunkwise``'s generic path (this strategy subclasses it); what this
strategy adds is the restriction to Muon (the linear-memory "attention" fast path of
``core:chunkwise`` never applies to Muon), per-chunk recomputation, and a higher auto priority.
``core:chunkwise`` also runs Muon rules, with the same results and without recomputation.
"""

from __future__ import annotations

from typing import Callable, Sequence

import torch
from torch.autograd.function import once_differentiable

from atlas_core.strategies.chunkwise import Chunkwise

from .muon import Muon
from .params import AtlasParallelParams


class _Recompute(torch.autograd.Function):
    """Run ``fn(*inputs) -> tuple of tensors`` without keeping its intermediates; recompute them
    in the backward pass.

    Hand-written instead of `torch.utils.checkpoint` because the non-reentrant checkpoint relies
    on saved-tensor hooks, which ``torch.func`` transforms (used by deep memories such as
    ``titans:mlp`` for their inner gradients) refuse, and the reentrant one does not support
    ``torch.autograd.grad``. ``extra`` tensors (the rule's learned parameters) are used by ``fn``
    through the module that owns them; listing them makes their gradients flow.
    First-order only (``once_differentiable``): set ``checkpoint = false`` for double backward."""

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
        pairs = [(o, g) for o, g in zip(outs, grads) if o.requires_grad]
        got = iter(())
        if wrt and pairs:
            got = iter(torch.autograd.grad(
                [o for o, _ in pairs], wrt, [g for _, g in pairs], allow_unused=True
            ))
        return (None, None, *[next(got) if need else None for need in needs])


def recompute(fn: Callable, inputs: Sequence[torch.Tensor], extra: Sequence[torch.Tensor] = ()):
    """``fn(*inputs)`` (a tuple of tensors) with its intermediates recomputed in the backward."""
    return _Recompute.apply(fn, len(inputs), *inputs, *extra)


class AtlasParallel(Chunkwise):
    name = "atlas_muon:atlas_parallel"

    def __init__(self, params: AtlasParallelParams | None = None) -> None:
        # Chunkwise reads ``chunk_size`` and ``backend`` from its params object
        super().__init__(params or AtlasParallelParams())
        self.checkpoint = self.params.checkpoint

    def describe(self) -> str:
        return f"{self.name}(chunk_size={self.chunk_size}, checkpoint={self.checkpoint})"

    def supports(self, rule) -> tuple[bool, str]:
        algorithm = getattr(rule, "algorithm", None)
        if not isinstance(algorithm, Muon):
            spec = getattr(rule, "spec", {}) or {}
            got = spec.get("algorithm", spec.get("use", type(rule).__name__))
            return False, (
                f"atlas_muon:atlas_parallel runs the Muon algorithm (atlas_muon:muon) only, got "
                f"algorithm {got!r}; use core:chunkwise for other algorithms"
            )
        return super().supports(rule)

    def fast_path(self, rule) -> bool:
        return False  # NS is nonlinear in Z: always the per-token (generic) chunk

    def _generic_chunk(self, rule, W, opt, *chunk_args):
        """``core:chunkwise``'s per-chunk step, recomputed in the backward pass when
        ``checkpoint`` is on. ``chunk_args`` (tensors, and dicts of tensors such as the gates) are
        passed through as the parent strategy defines them."""
        chunk = super()._generic_chunk
        if not (self.checkpoint and torch.is_grad_enabled()):
            return chunk(rule, W, opt, *chunk_args)
        # flatten every argument into one tensor list (fixed key order), rebuild them inside
        wk, ok = list(W), list(opt)
        layout = [list(a) if isinstance(a, dict) else None for a in chunk_args]
        flat = [W[k] for k in wk] + [opt[k] for k in ok]
        for arg, keys in zip(chunk_args, layout):
            flat += [arg[k] for k in keys] if keys is not None else [arg]

        def run(*t):
            it = iter(t)
            Wd = {k: next(it) for k in wk}
            od = {k: next(it) for k in ok}
            args = [{k: next(it) for k in keys} if keys is not None else next(it) for keys in layout]
            y, W1, o1 = chunk(rule, Wd, od, *args)
            return (y, *[W1[k] for k in wk], *[o1[k] for k in ok])

        params = [p for p in rule.parameters() if p.requires_grad]
        out = recompute(run, flat, params)
        nw = len(wk)
        return out[0], dict(zip(wk, out[1 : 1 + nw])), dict(zip(ok, out[1 + nw :]))


def build(params: AtlasParallelParams | None, ctx) -> AtlasParallel:
    return AtlasParallel(params)
