"""``cuda:chunk_linear``: the Triton backend of ``core:chunkwise``'s linear fast path.

Serves rules with the linear matrix memory (``core:linear``), the l2 or dot bias (alone or inside
an Omega window, Atlas Eq 9), a linear retention (``core:none`` / ``core:decay``) and the ``gd`` or
``momentum`` algorithm, for both read conventions. Everything else is refused with a reason, and
``core:chunkwise`` then runs its PyTorch code (or, if this backend was forced through
``ATLAS_BACKEND`` / the strategy's ``backend`` parameter, `atlas_core.backends` raises an error
naming this backend and the reason).

The call's tensors are those of `atlas_core.rule.MemoryInputs` (``psi, phik: [B, H, T, Dphi]``,
``v: [B, H, T, Dv]``, gates ``[B, H, T]``, state ``M, Z.M: [B, H, Dv, Dphi]`` and the window
buffers); `run` hands them to `chunk_linear.chunk_linear` and returns ``(y [B, H, T, Dv], state)``.
"""

from __future__ import annotations

import torch

from atlas_core.backends import Backend
from atlas_core.forms.catalogue import linear_kernel_reason

from .availability import interpreter_on, launch_errors, launch_fallback, tensors_runnable, triton_available
from .limits import (DTYPES, MAX_BACKWARD_HEAD_DIM, MAX_BACKWARD_MOMENTUM_ROWS, MAX_BACKWARD_TILE, MAX_CHUNK,
                     MAX_EXTENDED, MAX_HEAD_DIM)


def _pow2(n: int) -> int:
    return max(16, 1 << (max(int(n), 1) - 1).bit_length())


def rule_refusal(f) -> str | None:
    """Why the kernel cannot run a rule of form ``f`` (`atlas_core.forms.RuleForm`) whatever the
    call, or None: the catalogue's answer for a fused kernel of the linear chunk form
    (`atlas_core.forms.catalogue.linear_kernel_reason`: the linear matrix memory, gd or momentum,
    a linear per-head decay with the gradient at the current memory, the l2 or dot error alone or
    inside an Omega window)."""
    return linear_kernel_reason(f)


def speed_refusal(momentum: bool, window: int, backward: bool) -> str | None:
    """Why automatic dispatch leaves a call the kernel can serve to core:chunkwise's PyTorch code,
    or None: the cases where the kernel measured slower than that code on a GPU (NVIDIA H200,
    B = 8, H = 16, T = 4096, D = 64, C = 64, `benchmarks/bench_kernels.py`; docs/kernels.md
    "Measured on a GPU"). It measured faster only forward without gradients, gd, no window
    (2.3x float32, 4.6x bfloat16); with gradients 0.26-0.79x, momentum 0.81-0.98x, an Omega window
    0.53-0.70x. Forcing the backend (``ATLAS_BACKEND=cuda:chunk_linear``) still runs it."""
    slower = []
    if backward:
        slower.append("gradients are needed (fwd+bwd 0.26-0.79x)")
    if momentum:
        slower.append("momentum (0.81-0.98x)")
    if window > 1:
        slower.append(f"an Omega window c={window} (0.53-0.70x)")
    if not slower:
        return None
    return ("measured slower than core:chunkwise's PyTorch code on a GPU for " + ", ".join(slower)
            + " (docs/kernels.md); ATLAS_BACKEND=cuda:chunk_linear forces the kernel")


class ChunkLinearBackend(Backend):
    name = "cuda:chunk_linear"

    def is_available(self) -> tuple[bool, str]:
        return triton_available()

    def verify(self, strategy, rule, inputs) -> tuple[bool, str]:
        p = inputs
        f = rule.form
        why = rule_refusal(f)
        if why is not None:
            return False, why
        form, kind = f.update, f.error
        B, H, T = p.shape
        if T == 0:
            return False, "the sequence is empty"
        dk, dv = p.psi.shape[-1], p.v.shape[-1]
        if _pow2(dk) > MAX_HEAD_DIM or _pow2(dv) > MAX_HEAD_DIM:
            return False, f"head dims Dphi={dk}, Dv={dv} exceed {MAX_HEAD_DIM}"
        C, c, A = strategy.chunk_for(rule), f.window, f.anchor
        if C is None:
            return False, f"strategy {strategy.name} has no chunk_size"
        # the kernel takes each chunk's gradients at the chunk's start memory: that is the rule
        # when the chunks are its anchor blocks, or when the gradients ignore the memory (dot)
        if not (A == C or (A == 1 and kind == "dot")):
            return False, (
                f"the kernel anchors gradients at each chunk's start; the rule's anchor={A} "
                f"differs from chunk_size={C}"
            )
        if A > 1 and (rule.position(p) % C or T % C):
            return False, "the call does not cover whole anchor blocks (the kernel keeps no anchor memory)"
        if C > MAX_CHUNK:
            return False, f"chunk_size={C} exceeds {MAX_CHUNK}"
        if _pow2(C + c - 1) > MAX_EXTENDED:
            return False, f"chunk_size + window - 1 = {C + c - 1} exceeds {MAX_EXTENDED}"
        tensors = [p.psi, p.phik, p.v, p.alpha, *p.gates.values(), *p.state.values()]
        for t in tensors:
            if t.dtype not in DTYPES:
                return False, f"dtype {t.dtype} is not supported (float32, bfloat16, float16)"
        backward = torch.is_grad_enabled() and any(t.requires_grad for t in tensors)
        if backward and _pow2(dk) > MAX_BACKWARD_HEAD_DIM:
            return False, (
                f"gradients are needed and Dphi={dk} > {MAX_BACKWARD_HEAD_DIM}: the backward kernel's "
                "tiles need more shared memory than a GPU block has (262,144 B on sm_90 at Dphi = 128)"
            )
        if backward and form == "momentum" and _pow2(C + c - 1) > MAX_BACKWARD_MOMENTUM_ROWS:
            return False, (
                f"gradients are needed with momentum and chunk_size + window - 1 = {C + c - 1} > "
                f"{MAX_BACKWARD_MOMENTUM_ROWS}: the momentum backward kernel needs more shared memory "
                "than a GPU block has (253,952 B on sm_90 at 128 rows, Dphi = 32)"
            )
        if backward and _pow2(C + c - 1) * _pow2(dk) > MAX_BACKWARD_TILE:
            return False, (
                f"gradients are needed and (chunk_size + window - 1) x Dphi = {C + c - 1} x {dk} exceeds "
                f"{MAX_BACKWARD_TILE} after padding: the backward kernel would use nearly all of a GPU "
                "block's shared memory (229,376 B of 232,448 on sm_90 at 128 x 64)"
            )
        ok, why = tensors_runnable(*tensors)
        if not ok:
            return False, why
        if p.psi.is_cuda and not interpreter_on():  # what Triton's launch would refuse, refused here
            from .chunk_linear import Config
            from .compile_check import device_fits

            cfg = Config.make(C, c, dk, dv, kind, f.read, form == "momentum", p.psi.dtype)
            return device_fits(cfg, p.psi.dtype, backward, p.psi.device)
        return True, ""

    def prefers(self, strategy, rule, inputs) -> tuple[bool, str]:
        """On a GPU, automatic dispatch takes the kernel only where it measured faster
        (`speed_refusal`); under the interpreter (the kernel tests) it takes every call it can."""
        p, f = inputs, rule.form
        if interpreter_on() or not p.psi.is_cuda:
            return True, ""
        tensors = [p.psi, p.phik, p.v, p.alpha, *p.gates.values(), *p.state.values()]
        backward = torch.is_grad_enabled() and any(t.requires_grad for t in tensors)
        why = speed_refusal(f.momentum, f.window, backward)
        return why is None, why or ""

    def run(self, strategy, rule, inputs):
        try:
            return self._run(strategy, rule, inputs)
        except launch_errors() as exc:
            return launch_fallback(self.name, strategy, exc, lambda: strategy.run_torch(rule, inputs))

    def _run(self, strategy, rule, inputs):
        from .chunk_linear import chunk_linear

        p, f = inputs, rule.form
        xk, xv, xg = rule.extended_inputs(p)
        lag = rule.bias.lag_weights(torch.float32, p.v.device)
        momentum = f.momentum
        y, M, Z = chunk_linear(
            p.psi, xk, xv, xg, p.alpha, p.gates[f.gate("step_size")],
            p.gates[f.gate("momentum")] if momentum else None, lag,
            p.state["M"], p.state["Z.M"] if momentum else None,
            chunk_size=strategy.chunk_for(rule), bias=f.error, read=f.read,
        )
        dt = p.state["M"].dtype
        opt = {"Z.M": Z.to(dt)} if momentum else {}
        W = {"M": M.to(dt)}
        anchored = rule.anchor_state(p, W, W) if f.anchored else None  # whole blocks: W
        return y, rule.final_state(W, opt, xk, xv, xg, anchored)


_INSTANCE = ChunkLinearBackend()


def build(params, ctx) -> ChunkLinearBackend:
    return _INSTANCE
