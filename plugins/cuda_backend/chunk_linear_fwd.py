"""Triton forward kernel of the chunk-anchored linear-memory update (``core:chunkwise`` fast path).

Implements, per (batch, head), the chunk form of docs/math.md "Parallel forms" (Titans Sec 3.2, MIRAS
Eq 28, Atlas Eq 15) exactly as `atlas_core.forms.linear_scan.chunk_step` writes it.
For one chunk of n tokens (n <= C) with window c and m = n + c - 1 extended positions:

    U   = X M0^T - V              (l2)   or   -V   (dot)              [m, Dv]
    Wp  = diag(theta) Wm          Wm[t, l] = lag[t + c - 1 - l] * gamma_l (banded)   [n, m]
    K   = L Wp                    (gd)       L[t, j] = prod_{j<i<=t} alpha_i          [n, m]
    KZ  = E Wp,  K = L KZ         (momentum) E[t, j] = prod_{j<i<=t} eta_i
    y_t = A_t M0 psi_t - sum_l K[t, l] (psi_t . x_l) u_l - PL_t Z0 psi_t
    M'  = A_n M0 - U^T diag(K[n-1]) X - PL_n Z0,      Z' = P_n Z0 + U^T diag(KZ[n-1]) X

with A_t = prod_{i<=t} alpha_i, P_t = prod_{i<=t} eta_i, PL = L P. ``read = "before"`` uses the
rows of M_{t-1}: L and A are evaluated at the exclusive prefix (``L_r[t, j] = L[t-1, j]``, strict
lower triangle, ``A_r[t] = A_{t-1}``), which is the row shift of the PyTorch code without moving
data between rows.

Decay matrices are built in log space (FLA's gated kernels): ``b = cumsum(log alpha)``,
``L[t, j] = exp(b_t - b_j)`` on the lower triangle. Gates are clamped at 1e-30 before the log, so
a gate of exactly 0 becomes a factor of 1e-30 (documented in docs/kernels.md).

Memory plan (FLA's delta-rule kernels): one program per (batch, head) walks the chunks in order,
keeps M (and Z) in registers, and writes the state only at chunk starts (``m_chk: [BH, NT, Dv,
Dk]``); the backward recomputes everything inside a chunk from that checkpoint.

Tensor arguments (contiguous, BH = batch * heads, TE = T + c - 1):
    psi [BH, T, Dk]      xk [BH, TE, Dk]     xv [BH, TE, Dv]     xg [BH, TE]
    alpha, theta, eta [BH, T]                lag [c]
    m0, z0 [BH, Dv, Dk] (float32)            y [BH, T, Dv] (the input dtype)
    m_out, z_out [BH, Dv, Dk]                m_chk, z_chk [BH, NT, Dv, Dk] (float32)
Every load is upcast to float32 and every product accumulates in float32.
"""

from __future__ import annotations

import triton
import triton.language as tl


@triton.jit
def chunk_coefficients(
    a, th, e, g, band, rc, tmask, BC: tl.constexpr, MOMENTUM: tl.constexpr, BEFORE: tl.constexpr,
    PREC: tl.constexpr,
):
    """The chunk's coefficient matrices from its gates (shared by forward and backward).

    a, th, e: [BC] (padded rows: a = e = 1, th = 0); g: [BM]; band: [BC, BM]; tmask: [BC] the
    chunk's real rows. Padded rows of the row vectors ``llast`` / ``elast`` (row n-1 of L / E)
    are zeroed: their momentum rows would otherwise leak into the final state.
    Returns (la, b, Lr, Ar, llast, Wp, le, ce, Ed, elast, KZ, Kr, k, kz, P, PLr)."""
    la = tl.log(tl.maximum(a, 1e-30))
    b = tl.cumsum(la, 0)
    b_last = tl.sum(la, 0)
    incl = rc[:, None] >= rc[None, :]
    if BEFORE:
        rowexp = b - la
        Lmask = rc[:, None] > rc[None, :]
    else:
        rowexp = b
        Lmask = incl
    Lr = tl.where(Lmask, tl.exp(rowexp[:, None] - b[None, :]), 0.0)  # [BC, BC]
    Ar = tl.exp(rowexp)
    llast = tl.where(tmask, tl.exp(b_last - b), 0.0)  # row n-1 of L (padded gates are 1)
    Wp = th[:, None] * band * g[None, :]  # diag(theta) Wm: [BC, BM]
    if MOMENTUM:
        le = tl.log(tl.maximum(e, 1e-30))
        ce = tl.cumsum(le, 0)
        ce_last = tl.sum(le, 0)
        Ed = tl.where(incl, tl.exp(ce[:, None] - ce[None, :]), 0.0)
        KZ = tl.dot(Ed, Wp, input_precision=PREC)  # Z_t's coefficients
        Kr = tl.dot(Lr, KZ, input_precision=PREC)
        k = tl.sum(llast[:, None] * KZ, 0)  # last row of L KZ: [BM]
        elast = tl.where(tmask, tl.exp(ce_last - ce), 0.0)
        kz = tl.sum(elast[:, None] * Wp, 0)  # last row of E Wp
        P = tl.exp(ce)
        PLr = tl.sum(Lr * P[None, :], 1)  # Z0's coefficient in the read rows
    else:
        le = la
        ce = b
        Ed = Lr
        elast = llast
        KZ = Wp
        Kr = tl.dot(Lr, Wp, input_precision=PREC)
        k = tl.sum(llast[:, None] * Wp, 0)
        kz = k
        P = Ar
        PLr = Ar
    return la, b, Lr, Ar, llast, Wp, le, ce, Ed, elast, KZ, Kr, k, kz, P, PLr


@triton.jit
def chunk_linear_fwd_kernel(
    psi, xk, xv, xg, alpha, theta, eta, lag, m0, z0,
    y, m_out, z_out, m_chk, z_chk,
    T, NT, DK, DV, C, W,
    BC: tl.constexpr, BM: tl.constexpr, BK: tl.constexpr, BV: tl.constexpr,
    L2: tl.constexpr, MOMENTUM: tl.constexpr, BEFORE: tl.constexpr, PREC: tl.constexpr,
    PREC_IN: tl.constexpr,
):
    pid = tl.program_id(0).to(tl.int64)  # one (batch, head); offsets in int64
    iv = tl.program_id(1)  # one block of BV value dims (rows of M)
    TE = T + W - 1
    rc = tl.arange(0, BC)
    rm = tl.arange(0, BM)
    rk = tl.arange(0, BK)
    rv = iv * BV + tl.arange(0, BV)
    mk = rk < DK
    mv = rv < DV
    st_off = rv[:, None] * DK + rk[None, :]  # [BV, BK]
    st_mask = mv[:, None] & mk[None, :]
    M = tl.load(m0 + pid * DV * DK + st_off, mask=st_mask, other=0.0).to(tl.float32)
    if MOMENTUM:
        Z = tl.load(z0 + pid * DV * DK + st_off, mask=st_mask, other=0.0).to(tl.float32)
    else:
        Z = M  # unused
    # the banded window weights do not depend on the chunk: dist = how far back l is from t
    dist = rc[:, None] + W - 1 - rm[None, :]
    inband = (dist >= 0) & (dist < W)
    band = tl.load(lag + dist, mask=inband, other=0.0).to(tl.float32)  # [BC, BM]

    for i in range(NT):
        s = i * C
        n = tl.minimum(C, T - s)
        chk = (pid * NT + i) * DV * DK
        tl.store(m_chk + chk + st_off, M, mask=st_mask)
        if MOMENTUM:
            tl.store(z_chk + chk + st_off, Z, mask=st_mask)
        tmask = rc < n
        emask = (rm < n + W - 1) & (s + rm < TE)
        tok = pid * T + s + rc  # [BC] flat token rows
        ext = pid * TE + s + rm  # [BM] flat extended rows
        Xq = tl.load(psi + tok[:, None] * DK + rk[None, :], mask=tmask[:, None] & mk[None, :], other=0.0).to(tl.float32)
        X = tl.load(xk + ext[:, None] * DK + rk[None, :], mask=emask[:, None] & mk[None, :], other=0.0).to(tl.float32)
        V = tl.load(xv + ext[:, None] * DV + rv[None, :], mask=emask[:, None] & mv[None, :], other=0.0).to(tl.float32)
        g = tl.load(xg + ext, mask=emask, other=0.0).to(tl.float32)
        a = tl.load(alpha + tok, mask=tmask, other=1.0).to(tl.float32)
        th = tl.load(theta + tok, mask=tmask, other=0.0).to(tl.float32)
        if MOMENTUM:
            e = tl.load(eta + tok, mask=tmask, other=1.0).to(tl.float32)
        else:
            e = a
        la, b, Lr, Ar, llast, Wp, le, ce, Ed, elast, KZ, Kr, k, kz, P, PLr = chunk_coefficients(
            a, th, e, g, band, rc, tmask, BC, MOMENTUM, BEFORE, PREC
        )
        if L2:
            U = tl.dot(X, tl.trans(M), input_precision=PREC) - V  # errors at the anchor: [BM, BV]
        else:
            U = -V
        S = tl.dot(Xq, tl.trans(X), input_precision=PREC_IN)  # (psi_t . x_l): [BC, BM]
        out = Ar[:, None] * tl.dot(Xq, tl.trans(M), input_precision=PREC)
        out -= tl.dot(Kr * S, U, input_precision=PREC)
        A_last = tl.exp(tl.sum(la, 0))
        Mn = A_last * M - tl.dot(tl.trans(U * k[:, None]), X, input_precision=PREC)  # [BV, BK]
        if MOMENTUM:
            out -= PLr[:, None] * tl.dot(Xq, tl.trans(Z), input_precision=PREC)
            pl_last = tl.sum(llast * P, 0)
            P_last = tl.exp(tl.sum(le, 0))
            Mn -= pl_last * Z
            Z = P_last * Z + tl.dot(tl.trans(U * kz[:, None]), X, input_precision=PREC)
        M = Mn
        tl.store(y + tok[:, None] * DV + rv[None, :], out.to(y.dtype.element_ty), mask=tmask[:, None] & mv[None, :])

    tl.store(m_out + pid * DV * DK + st_off, M, mask=st_mask)
    if MOMENTUM:
        tl.store(z_out + pid * DV * DK + st_off, Z, mask=st_mask)
