"""Triton kernels for the MRU matrix-product scan, forward and backward (seed 002; docs/math.md "Matrix
Recurrent Unit"), as a differentiable op.

    H_t = H_{t-1} X_t   (earlier factors on the left),   H_0 = h0 or the identity

``mru_scan(X, h0=None, chunk=32)``: ``X: [B, H, T, d, d]`` (float32, bfloat16 or float16),
``h0: [B, H, d, d]`` or None -> ``H: [B, H, T, d, d]`` in X's dtype (computed in float32).
The readable reference is `atlas_plugins.mru.cumprod.cumprod_loop`.

A three-phase chunked scan (the classic "reduce, scan the chunk totals, apply"), so the work is
parallel over (batch x head) x chunks and only the NT = T / chunk chunk totals are sequential:

forward   1. per chunk, in parallel:  local prefixes  P_t = X_s ... X_t  (written into H), and the
             chunk total  Tot_i = P_e;
          2. per (batch, head):       chunk-start states  S_0 = h0,  S_{i+1} = S_i Tot_i;
          3. per chunk, in parallel:  H_t = S_i P_t.
backward  with  B_T = dH_T,  B_t = dH_t + B_{t+1} X_{t+1}^T,  dX_t = H_{t-1}^T B_t,  dh0 = B_1 X_1^T:
          1. per chunk: the local reverse recursion with no carry gives  Bloc_s  and
             c_i = Bloc_s X_s^T;
          2. per (batch, head), chunks in reverse: the carry into chunk i from the right
             G_i (G_last = 0),  G_{i-1} = c_i + G_i Tot_i^T;  dh0 = G_{-1};
          3. per chunk: B_e = dH_e + G_i, the reverse recursion, and dX_t = H_{t-1}^T B_t.
The incoming gradient is only read. Work: about 2T (forward) and 3T (backward) d x d products.
Matrices are padded to a power-of-two block with zeros (a zero border stays zero under products);
blocks under 16 use broadcast-and-sum products instead of tl.dot, whose GPU tiles start at 16.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from .device import device_guard
from .chunk_linear import precision_for

MAX_D = 64
DTYPES = (torch.float32, torch.bfloat16, torch.float16)


@triton.jit
def _mm(a, b, BD: tl.constexpr, PREC: tl.constexpr):
    if BD >= 16:
        return tl.dot(a, b, input_precision=PREC)
    else:
        return tl.sum(a[:, :, None] * b[None, :, :], 1)


@triton.jit
def _eye(BD: tl.constexpr):
    r = tl.arange(0, BD)
    return tl.where(r[:, None] == r[None, :], 1.0, 0.0)


@triton.jit
def mru_fwd_local(X, H, TOT, T, NT, D, C, BD: tl.constexpr, PREC: tl.constexpr):
    bh = tl.program_id(0).to(tl.int64)
    i = tl.program_id(1)
    r = tl.arange(0, BD)
    off = r[:, None] * D + r[None, :]
    mask = (r[:, None] < D) & (r[None, :] < D)
    s = i * C
    n = tl.minimum(C, T - s)
    P = _eye(BD)
    for j in range(n):
        t = (bh * T + s + j) * D * D
        P = _mm(P, tl.load(X + t + off, mask=mask, other=0.0).to(tl.float32), BD, PREC)
        tl.store(H + t + off, P, mask=mask)
    tl.store(TOT + (bh * NT + i) * D * D + off, P, mask=mask)


@triton.jit
def mru_fwd_states(H0, TOT, S, NT, D, HAS_H0: tl.constexpr, BD: tl.constexpr, PREC: tl.constexpr):
    bh = tl.program_id(0).to(tl.int64)
    r = tl.arange(0, BD)
    off = r[:, None] * D + r[None, :]
    mask = (r[:, None] < D) & (r[None, :] < D)
    if HAS_H0:
        St = tl.load(H0 + bh * D * D + off, mask=mask, other=0.0).to(tl.float32)
    else:
        St = _eye(BD)
    for i in range(NT):
        c = (bh * NT + i) * D * D
        tl.store(S + c + off, St, mask=mask)
        St = _mm(St, tl.load(TOT + c + off, mask=mask, other=0.0), BD, PREC)


@triton.jit
def mru_fwd_apply(H, S, T, NT, D, C, BD: tl.constexpr, PREC: tl.constexpr):
    bh = tl.program_id(0).to(tl.int64)
    i = tl.program_id(1)
    r = tl.arange(0, BD)
    off = r[:, None] * D + r[None, :]
    mask = (r[:, None] < D) & (r[None, :] < D)
    s = i * C
    n = tl.minimum(C, T - s)
    Si = tl.load(S + (bh * NT + i) * D * D + off, mask=mask, other=0.0)
    for j in range(n):
        t = (bh * T + s + j) * D * D
        tl.store(H + t + off, _mm(Si, tl.load(H + t + off, mask=mask, other=0.0), BD, PREC), mask=mask)


@triton.jit
def mru_bwd_local(X, DH, CC, T, NT, D, C, BD: tl.constexpr, PREC: tl.constexpr):
    bh = tl.program_id(0).to(tl.int64)
    i = tl.program_id(1)
    r = tl.arange(0, BD)
    off = r[:, None] * D + r[None, :]
    mask = (r[:, None] < D) & (r[None, :] < D)
    s = i * C
    n = tl.minimum(C, T - s)
    base = bh * T + s
    Bl = tl.load(DH + (base + n - 1) * D * D + off, mask=mask, other=0.0).to(tl.float32)
    for jj in range(n - 1):
        t = base + n - 2 - jj
        Xn = tl.load(X + (t + 1) * D * D + off, mask=mask, other=0.0).to(tl.float32)
        Bl = tl.load(DH + t * D * D + off, mask=mask, other=0.0).to(tl.float32) + _mm(Bl, tl.trans(Xn), BD, PREC)
    Xs = tl.load(X + base * D * D + off, mask=mask, other=0.0).to(tl.float32)
    tl.store(CC + (bh * NT + i) * D * D + off, _mm(Bl, tl.trans(Xs), BD, PREC), mask=mask)


@triton.jit
def mru_bwd_carries(CC, TOT, G, DH0, NT, D, BD: tl.constexpr, PREC: tl.constexpr):
    bh = tl.program_id(0).to(tl.int64)
    r = tl.arange(0, BD)
    off = r[:, None] * D + r[None, :]
    mask = (r[:, None] < D) & (r[None, :] < D)
    Gc = tl.zeros([BD, BD], dtype=tl.float32)
    for ii in range(NT):
        i = NT - 1 - ii
        c = (bh * NT + i) * D * D
        tl.store(G + c + off, Gc, mask=mask)
        Gc = tl.load(CC + c + off, mask=mask, other=0.0) + _mm(
            Gc, tl.trans(tl.load(TOT + c + off, mask=mask, other=0.0)), BD, PREC
        )
    tl.store(DH0 + bh * D * D + off, Gc, mask=mask)


@triton.jit
def mru_bwd_apply(X, H, S, DH, G, DX, T, NT, D, C, BD: tl.constexpr, PREC: tl.constexpr):
    bh = tl.program_id(0).to(tl.int64)
    i = tl.program_id(1)
    r = tl.arange(0, BD)
    off = r[:, None] * D + r[None, :]
    mask = (r[:, None] < D) & (r[None, :] < D)
    s = i * C
    n = tl.minimum(C, T - s)
    base = bh * T + s
    c = (bh * NT + i) * D * D
    e = base + n - 1
    B = tl.load(DH + e * D * D + off, mask=mask, other=0.0).to(tl.float32) + tl.load(G + c + off, mask=mask, other=0.0)
    for jj in range(n):
        t = e - jj
        if jj > 0:
            Xn = tl.load(X + (t + 1) * D * D + off, mask=mask, other=0.0).to(tl.float32)
            B = tl.load(DH + t * D * D + off, mask=mask, other=0.0).to(tl.float32) + _mm(B, tl.trans(Xn), BD, PREC)
        if t == base:  # H_{s-1} is the chunk-start state
            Hp = tl.load(S + c + off, mask=mask, other=0.0)
        else:
            Hp = tl.load(H + (t - 1) * D * D + off, mask=mask, other=0.0)
        tl.store(DX + t * D * D + off, _mm(tl.trans(Hp), B, BD, PREC), mask=mask)


def _block(d: int) -> int:
    return max(2, triton.next_power_of_2(d))


# each kernel and its pointer arguments in the input dtype (the others are float32)
KERNELS = {
    "mru_fwd_local": ("X",), "mru_fwd_states": (), "mru_fwd_apply": (),
    "mru_bwd_local": ("X", "DH"), "mru_bwd_carries": (), "mru_bwd_apply": ("X", "DH"),
}


def launch_options(d: int, dtype: torch.dtype) -> dict:
    """Constexprs and launch options of every scan kernel at state size d. Every product involves
    a running product (float32 state), so all use `precision_for` (IEEE unless ATLAS_TRITON_TF32).
    One d x d block per program: 4 warps up to d = 32, 8 at d = 64."""
    BD = _block(d)
    return dict(BD=BD, PREC=precision_for(dtype), num_warps=8 if BD >= 64 else 4, num_stages=1)


class MRUScanFn(torch.autograd.Function):
    @staticmethod
    def forward(ctx, X, h0, chunk: int):
        B, Hh, T, d, _ = X.shape
        BH, NT = B * Hh, triton.cdiv(T, chunk)
        f32 = dict(dtype=torch.float32, device=X.device)
        Xf = X.reshape(BH, T, d, d).contiguous()
        h0f = h0.reshape(BH, d, d).float().contiguous() if h0 is not None else Xf
        H = torch.empty(BH, T, d, d, **f32)  # float32 whatever X's dtype: prefixes are reread
        TOT = torch.empty(BH, NT, d, d, **f32)
        S = torch.empty(BH, NT, d, d, **f32)
        kw = launch_options(d, X.dtype)
        with device_guard(X):
            mru_fwd_local[(BH, NT)](Xf, H, TOT, T, NT, d, chunk, **kw)
            mru_fwd_states[(BH,)](h0f, TOT, S, NT, d, HAS_H0=h0 is not None, **kw)
            mru_fwd_apply[(BH, NT)](H, S, T, NT, d, chunk, **kw)
        ctx.save_for_backward(Xf, H, TOT, S)
        ctx.meta = (B, Hh, T, d, chunk, h0 is not None, h0.dtype if h0 is not None else None)
        return H.view(B, Hh, T, d, d).to(X.dtype)

    @staticmethod
    def backward(ctx, dH):
        Xf, H, TOT, S = ctx.saved_tensors
        B, Hh, T, d, chunk, has_h0, h0_dtype = ctx.meta
        BH, NT = B * Hh, TOT.shape[1]
        f32 = dict(dtype=torch.float32, device=Xf.device)
        dHf = dH.reshape(BH, T, d, d).contiguous()
        CC = torch.empty(BH, NT, d, d, **f32)
        G = torch.empty(BH, NT, d, d, **f32)
        dh0 = torch.empty(BH, d, d, **f32)
        dX = torch.empty(BH, T, d, d, **f32)
        kw = launch_options(d, Xf.dtype)
        with device_guard(Xf):
            mru_bwd_local[(BH, NT)](Xf, dHf, CC, T, NT, d, chunk, **kw)
            mru_bwd_carries[(BH,)](CC, TOT, G, dh0, NT, d, **kw)
            mru_bwd_apply[(BH, NT)](Xf, H, S, dHf, G, dX, T, NT, d, chunk, **kw)
        dX = dX.view(B, Hh, T, d, d).to(Xf.dtype)
        return dX, (dh0.view(B, Hh, d, d).to(h0_dtype) if has_h0 else None), None


def mru_scan(X: torch.Tensor, h0: torch.Tensor | None = None, chunk: int = 32) -> torch.Tensor:
    """``H_t = h0 X_1 ... X_t``; see the module docstring for shapes."""
    if X.dim() != 5 or X.shape[-1] != X.shape[-2]:
        raise ValueError(f"mru_scan: X must be [B, H, T, d, d], got shape {tuple(X.shape)}")
    B, Hh, T, d, _ = X.shape
    if X.dtype not in DTYPES:
        raise ValueError(f"mru_scan: dtype {X.dtype} is not one of {DTYPES}")
    if d > MAX_D:
        raise ValueError(f"mru_scan: d={d} exceeds {MAX_D}")
    if T == 0:
        raise ValueError("mru_scan: X has no tokens (T = 0)")
    if chunk < 1:
        raise ValueError(f"mru_scan: chunk={chunk} must be >= 1")
    if h0 is not None and tuple(h0.shape) != (B, Hh, d, d):
        raise ValueError(f"mru_scan: h0 must be [B, H, d, d] = {[B, Hh, d, d]}, got {tuple(h0.shape)}")
    return MRUScanFn.apply(X, h0, int(chunk))
