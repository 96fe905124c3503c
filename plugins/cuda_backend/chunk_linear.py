"""The chunk-anchored linear-memory update as a differentiable op over the Triton kernels.

``chunk_linear(psi, xk, xv, xg, alpha, theta, eta, lag, m0, z0, chunk_size=, bias=, read=)``
computes what ``core:chunkwise``'s linear fast path computes
(`atlas_core.forms.linear_scan.chunk_step`, the readable reference), with the
forward in `chunk_linear_fwd` and the backward in `chunk_linear_bwd`, both Triton.

Arguments (time-major per head, as in `atlas_core.rule.MemoryInputs`; c = window, TE = T + c - 1):
    psi:   [B, H, T, Dk]   phi(q)
    xk:    [B, H, TE, Dk]  phi(k) with the carried window keys first (``rule.extended_inputs``)
    xv:    [B, H, TE, Dv]  v, likewise extended
    xg:    [B, H, TE]      gamma, likewise extended (ones without a gamma gate)
    alpha: [B, H, T]       retain factor;  theta: [B, H, T] learning rate
    eta:   [B, H, T] momentum decay, or None for gd
    lag:   [c]             window weights by distance (index 0 = the current token)
    m0:    [B, H, Dv, Dk]  the memory before the call;  z0: the momentum before it, or None
Returns ``(y [B, H, T, Dv] in the input dtype, M [B, H, Dv, Dk] float32, Z or None)``.

psi/xk/xv/gates may be float32, bfloat16 or float16; the kernels accumulate in float32 and the
states stay float32. Gradients flow to every tensor argument (lag included).
"""

from __future__ import annotations

import os
from dataclasses import dataclass

import torch
import triton

from .device import device_guard
from .limits import DTYPES, MAX_CHUNK, MAX_EXTENDED, MAX_HEAD_DIM

TF32_ENV = "ATLAS_TRITON_TF32"


def tf32_requested() -> bool:
    return os.environ.get(TF32_ENV, "") in ("1", "true", "yes")


def precision_for(dtype: torch.dtype) -> str:
    """The precision of every product that involves a float32 quantity the kernel computed (the
    state, errors, decay coefficients, gradients): IEEE float32 whatever the input dtype, unless
    ``ATLAS_TRITON_TF32=1`` (TF32 rounds operands to 10 mantissa bits, a relative error of ~5e-4
    per product that the state would carry from chunk to chunk). Accumulation is float32 always."""
    return "tf32" if tf32_requested() else "ieee"


def input_precision_for(dtype: torch.dtype) -> str:
    """The precision of the one product of two input tiles as loaded (``psi . x``). TF32 would be
    exact there for bfloat16 / float16 inputs (TF32 represents their values: 8 and 11 significant
    bits <= 11), but its operands are staged through shared memory: the bf16 forward at Dk = 128
    with a 128-row window needed 229,376 B of the H100's 232,448. So it follows `precision_for`
    (IEEE unless ATLAS_TRITON_TF32=1), and every dtype compiles to the same structure."""
    return precision_for(dtype)


def block(n: int) -> int:
    """A power-of-two block of at least 16 (tl.dot's smallest tile on GPUs)."""
    return max(16, triton.next_power_of_2(max(int(n), 1)))


# the most value dims (rows of M) one program carries; Dv above it is split across programs
VALUE_BLOCK = 64


def value_block(BK: int, BV: int, backward: bool) -> int:
    """The value dims one program carries (``BV``: Dv padded)."""
    return min(BV, VALUE_BLOCK)


def launch_options(BK: int, BV: int, BM: int, momentum: bool, backward: bool) -> dict:
    """num_warps and num_stages for a tile size (docs/kernels.md "Resources on sm_90").

    ``num_stages = 1``: the chunk loop is sequential through the state, so software pipelining
    of its loads buys little, and its multi-buffered copies are what pushed the D = 128 tiles
    past the 227 KiB of shared memory an H100 block may use."""
    return dict(num_warps=8 if BK * BV > (2048 if backward else 4096) else 4, num_stages=1)


@dataclass(frozen=True)
class Config:
    """A launch of the kernels: the problem's sizes and modes, the padded tiles (BV is the block
    of value dims one program handles: ``NV = ceil(Dv / BV)`` programs share a (batch, head),
    each carrying its rows of M and Z, as FLA splits Dv) and the products' precisions."""

    chunk_size: int
    window: int
    l2: bool
    momentum: bool
    before: bool
    BC: int
    BM: int
    BK: int
    BV: int  # the forward's value block
    BVB: int  # the backward's
    precision: str
    input_precision: str

    @classmethod
    def make(cls, chunk_size, window, dk, dv, bias, read, momentum, dtype) -> "Config":
        BK = block(dk)
        return cls(
            chunk_size=chunk_size, window=window, l2=(bias == "l2"), momentum=momentum,
            before=(read == "before"), BC=block(chunk_size), BM=block(chunk_size + window - 1),
            BK=BK, BV=value_block(BK, block(dv), False), BVB=value_block(BK, block(dv), True),
            precision=precision_for(dtype), input_precision=input_precision_for(dtype),
        )

    def programs(self, dv: int, backward: bool = False) -> int:
        """Programs per (batch, head): NV = ceil(Dv / value block)."""
        return triton.cdiv(dv, self.BVB if backward else self.BV)

    def launch(self, backward: bool = False) -> dict:
        """Constexprs and launch options (see `launch_options`)."""
        BV = self.BVB if backward else self.BV
        return dict(
            BC=self.BC, BM=self.BM, BK=self.BK, BV=BV, L2=self.l2, MOMENTUM=self.momentum,
            BEFORE=self.before, PREC=self.precision, PREC_IN=self.input_precision,
            **launch_options(self.BK, BV, self.BM, self.momentum, backward),
        )


def _flat(x: torch.Tensor) -> torch.Tensor:
    """[B, H, ...] -> contiguous [B * H, ...]."""
    return x.reshape(x.shape[0] * x.shape[1], *x.shape[2:]).contiguous()


class ChunkLinearFn(torch.autograd.Function):
    @staticmethod
    def forward(ctx, psi, xk, xv, xg, alpha, theta, eta, lag, m0, z0, cfg: Config):
        from .chunk_linear_fwd import chunk_linear_fwd_kernel

        B, H, T, DK = psi.shape
        DV = xv.shape[-1]
        BH, C, c = B * H, cfg.chunk_size, cfg.window
        NT = triton.cdiv(T, C)
        dev = psi.device
        f32 = dict(dtype=torch.float32, device=dev)
        args = [_flat(t) for t in (psi, xk, xv, xg, alpha, theta)]
        eta_f = _flat(eta) if cfg.momentum else args[4]
        lag_f = lag.contiguous()
        m0_f = _flat(m0.float())
        z0_f = _flat(z0.float()) if cfg.momentum else m0_f
        y = torch.empty(BH, T, DV, dtype=psi.dtype, device=dev)
        m_out = torch.empty(BH, DV, DK, **f32)
        z_out = torch.empty(BH, DV, DK, **f32) if cfg.momentum else m_out
        m_chk = torch.empty(BH, NT, DV, DK, **f32)
        z_chk = torch.empty(BH, NT, DV, DK, **f32) if cfg.momentum else m_chk
        with device_guard(psi):
            chunk_linear_fwd_kernel[(BH, cfg.programs(DV))](
                *args, eta_f, lag_f, m0_f, z0_f, y, m_out, z_out, m_chk, z_chk,
                T, NT, DK, DV, C, c, **cfg.launch(),
            )
        ctx.cfg = cfg
        ctx.save_for_backward(*args, eta_f, lag_f, m_chk, z_chk)
        ctx.shapes = (B, H, T, DK, DV)
        ctx.state_dtype = m0.dtype
        y = y.view(B, H, T, DV)
        M = m_out.view(B, H, DV, DK)
        Z = z_out.view(B, H, DV, DK) if cfg.momentum else None
        return y, M, Z

    @staticmethod
    def backward(ctx, dy, dM, dZ):
        from .chunk_linear_bwd import chunk_linear_backward

        return chunk_linear_backward(ctx, dy, dM, dZ) + (None,)


def chunk_linear(psi, xk, xv, xg, alpha, theta, eta, lag, m0, z0, *, chunk_size: int,
                 bias: str = "l2", read: str = "after"):
    """See the module docstring. Validates shapes; returns ``(y, M, Z)``."""
    B, H, T, DK = psi.shape
    c = lag.shape[0]
    DV = xv.shape[-1]
    want = {
        "xk": (xk, (B, H, T + c - 1, DK)), "xv": (xv, (B, H, T + c - 1, DV)),
        "xg": (xg, (B, H, T + c - 1)), "alpha": (alpha, (B, H, T)), "theta": (theta, (B, H, T)),
        "m0": (m0, (B, H, DV, DK)),
    }
    if eta is not None:
        want["eta"] = (eta, (B, H, T))
        want["z0"] = (z0, (B, H, DV, DK))
    for name, (x, shape) in want.items():
        if x is None or tuple(x.shape) != shape:
            got = None if x is None else tuple(x.shape)
            raise ValueError(f"chunk_linear: {name} must have shape {shape}, got {got}")
    if bias not in ("l2", "dot"):
        raise ValueError(f"chunk_linear: bias={bias!r} must be 'l2' or 'dot'")
    if read not in ("after", "before"):
        raise ValueError(f"chunk_linear: read={read!r} must be 'after' or 'before'")
    if psi.dtype not in DTYPES:
        raise ValueError(f"chunk_linear: dtype {psi.dtype} is not one of {DTYPES}")
    cfg = Config.make(chunk_size, c, DK, DV, bias, read, eta is not None, psi.dtype)
    if cfg.BC > MAX_CHUNK or cfg.BM > MAX_EXTENDED or cfg.BK > MAX_HEAD_DIM or block(DV) > MAX_HEAD_DIM:
        raise ValueError(
            f"chunk_linear: chunk_size={chunk_size}, window={c}, Dk={DK}, Dv={DV} exceed the kernel "
            f"limits (C <= {MAX_CHUNK}, C + c - 1 <= {MAX_EXTENDED}, D <= {MAX_HEAD_DIM})"
        )
    dt = psi.dtype
    # keys/values travel in the input dtype; gates stay float32 (they enter logs and products)
    xk, xv = xk.to(dt), xv.to(dt)
    xg, alpha, theta = xg.float(), alpha.float(), theta.float()
    eta = eta.float() if eta is not None else None
    return ChunkLinearFn.apply(psi, xk, xv, xg, alpha, theta, eta, lag.float(), m0, z0, cfg)
