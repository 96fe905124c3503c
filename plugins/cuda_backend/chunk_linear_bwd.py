"""Triton backward kernel of the chunk-anchored linear-memory update, and its launcher.

The forward (`chunk_linear_fwd`) stored the memory only at chunk starts. Here one program per
(batch, head) walks the chunks in REVERSE, reloads the chunk's anchor ``M0`` (and ``Z0``),
recomputes the chunk's coefficient matrices and errors, and propagates the gradient of the state
after the chunk (``dM'``, ``dZ'``) to the state before it, collecting every per-token gradient on
the way. Per chunk (notation of `chunk_linear_fwd`; R = Kr * S):

    from y:   dR = -dy U^T      dU = -R^T dy      dS = dR * Kr      dKr = dR * S
              dpsi = (Ar dy) M0 + dS X - (PLr dy) Z0      dX = dS^T psi
              dM0 = (Ar dy)^T psi     dZ0 = -(PLr dy)^T psi    dAr = rowsum(dy * psi M0^T)
    from M' = A_n M0 - U^T diag(k) X - PL_n Z0 and Z' = P_n Z0 + U^T diag(kz) X:
              dU += X (kz dZ' - k dM')^T rows      dX += rows of U (kz dZ' - k dM')
              dk = -rowsum((U dM') * X)     dkz = rowsum((U dZ') * X)
    from U = X M0^T - V (l2):   dX += dU M0,  dM0 += dU^T X,  dV = -dU   (dot: dV = -dU)
    coefficients:  K = L KZ, KZ = E Wp (gd: K = L Wp), Wp = diag(theta) band diag(gamma)
    gates, in log space: L[t, j] = exp(r_t - b_j) with b = cumsum(log alpha) and r = b (read
              after) or b - log alpha (read before): d r_t += sum_j dL L, d b_j -= sum_t dL L,
              then d log alpha_j = sum_{t >= j} d b_t (a reverse cumsum) and d alpha = d log alpha
              / alpha; the same for eta through E and P.

Gradients of the extended rows (window keys, values, gammas): each chunk writes the rows of its
own tokens directly; its first c - 1 rows (tokens of the previous chunk, or the carried window
state) go to a separate per-chunk buffer that the launcher adds in with ``index_add_``, so no two
writes of the kernel ever touch one address.

Tensor arguments (contiguous; BH = batch * heads, TE = T + c - 1, NT chunks, HW = max(c-1, 1)):
    as the forward, plus m_chk, z_chk [BH, NT, Dv, Dk]; dy [BH, T, Dv]; dmT, dzT [BH, Dv, Dk];
    outputs dxv [BH, TE, Dv], dhv [BH, NT, HW, Dv], dm0, dz0 [BH, Dv, Dk] (each program writes its
    block of value dims) and, one slice per value block (NV = ceil(Dv / BV) programs per (batch,
    head); the launcher sums them), dpsi [NV, BH, T, Dk], dxk [NV, BH, TE, Dk], dxg [NV, BH, TE],
    dhk [NV, BH, NT, HW, Dk], dhg [NV, BH, NT, HW], dalpha, dtheta, deta [NV, BH, T],
    dlag [NV, BH, BW]. All gradients are float32. Every gradient that sums over the value dims
    (through dy U^T, U dM', M0's rows) is a sum of per-block terms, so the split is exact.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from .device import device_guard
from .chunk_linear_fwd import chunk_coefficients


@triton.jit
def _revcumsum(x):
    """``out_j = sum_{t >= j} x_t`` along axis 0."""
    return tl.sum(x, 0) - tl.cumsum(x, 0) + x


@triton.jit
def chunk_linear_bwd_kernel(
    psi, xk, xv, xg, alpha, theta, eta, lag, m_chk, z_chk, dy, dmT, dzT,
    dpsi, dxk, dxv, dxg, dhk, dhv, dhg, dalpha, dtheta, deta, dm0, dz0, dlag,
    T, NT, DK, DV, C, W,
    BC: tl.constexpr, BM: tl.constexpr, BK: tl.constexpr, BV: tl.constexpr, BW: tl.constexpr,
    L2: tl.constexpr, MOMENTUM: tl.constexpr, BEFORE: tl.constexpr, PREC: tl.constexpr,
    PREC_IN: tl.constexpr,
):
    pid = tl.program_id(0).to(tl.int64)  # offsets in int64
    iv = tl.program_id(1)  # this program's block of value dims (rows of M)
    TE = T + W - 1
    HW = tl.maximum(W - 1, 1)
    # the gradients that sum over the value dims go to this block's slice of [NV, ...] buffers
    nbh = tl.num_programs(0).to(tl.int64)
    dpsi += iv * nbh * T * DK
    dxk += iv * nbh * TE * DK
    dxg += iv * nbh * TE
    dhk += iv * nbh * NT * HW * DK
    dhg += iv * nbh * NT * HW
    dalpha += iv * nbh * T
    dtheta += iv * nbh * T
    deta += iv * nbh * T
    dlag += iv * nbh * BW
    rc = tl.arange(0, BC)
    rm = tl.arange(0, BM)
    rk = tl.arange(0, BK)
    rv = iv * BV + tl.arange(0, BV)
    rw = tl.arange(0, BW)
    mk = rk < DK
    mv = rv < DV
    st_off = rv[:, None] * DK + rk[None, :]
    st_mask = mv[:, None] & mk[None, :]
    dM = tl.load(dmT + pid * DV * DK + st_off, mask=st_mask, other=0.0)
    if MOMENTUM:
        dZ = tl.load(dzT + pid * DV * DK + st_off, mask=st_mask, other=0.0)
    else:
        dZ = dM
    dist = rc[:, None] + W - 1 - rm[None, :]
    inband = (dist >= 0) & (dist < W)
    band = tl.load(lag + dist, mask=inband, other=0.0).to(tl.float32)
    dlag_acc = tl.zeros([BW], dtype=tl.float32)

    for j in range(NT):
        i = NT - 1 - j
        s = i * C
        n = tl.minimum(C, T - s)
        chk = (pid * NT + i) * DV * DK
        M = tl.load(m_chk + chk + st_off, mask=st_mask, other=0.0)
        if MOMENTUM:
            Z = tl.load(z_chk + chk + st_off, mask=st_mask, other=0.0)
        else:
            Z = M
        tmask = rc < n
        emask = (rm < n + W - 1) & (s + rm < TE)
        tok = pid * T + s + rc
        ext = pid * TE + s + rm
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
        DY = tl.load(dy + tok[:, None] * DV + rv[None, :], mask=tmask[:, None] & mv[None, :], other=0.0).to(tl.float32)
        la, b, Lr, Ar, llast, Wp, le, ce, Ed, elast, KZ, Kr, k, kz, P, PLr = chunk_coefficients(
            a, th, e, g, band, rc, tmask, BC, MOMENTUM, BEFORE, PREC
        )
        if L2:
            U = tl.dot(X, tl.trans(M), input_precision=PREC) - V
        else:
            U = -V
        S = tl.dot(Xq, tl.trans(X), input_precision=PREC_IN)
        A_last = tl.exp(tl.sum(la, 0))

        # -- through the read y = Ar (psi M0^T) - (Kr * S) U - PLr (psi Z0^T) --------------------
        dR = -tl.dot(DY, tl.trans(U), input_precision=PREC)  # [BC, BM]
        dU = -tl.dot(tl.trans(Kr * S), DY, input_precision=PREC)  # [BM, BV]
        dS = dR * Kr
        dKr = dR * S
        ADY = Ar[:, None] * DY
        dXq = tl.dot(ADY, M, input_precision=PREC) + tl.dot(dS, X, input_precision=PREC)
        dX = tl.dot(tl.trans(dS), Xq, input_precision=PREC)  # [BM, BK]
        dAr = tl.sum(DY * tl.dot(Xq, tl.trans(M), input_precision=PREC), 1)
        dM0 = tl.dot(tl.trans(ADY), Xq, input_precision=PREC) + A_last * dM
        dA_last = tl.sum(tl.sum(dM * M, 1), 0)
        # -- through M' = A_n M0 - U^T diag(k) X - PL_n Z0 ---------------------------------------
        UdM = tl.dot(U, dM, input_precision=PREC)  # [BM, BK]
        dU -= k[:, None] * tl.dot(X, tl.trans(dM), input_precision=PREC)
        dX -= k[:, None] * UdM
        dk = -tl.sum(UdM * X, 1)  # [BM]
        if MOMENTUM:
            PDY = PLr[:, None] * DY
            dPLr = -tl.sum(DY * tl.dot(Xq, tl.trans(Z), input_precision=PREC), 1)
            dXq -= tl.dot(PDY, Z, input_precision=PREC)
            pl_last = tl.sum(llast * P, 0)
            P_last = tl.exp(tl.sum(le, 0))
            dZ0 = -tl.dot(tl.trans(PDY), Xq, input_precision=PREC) - pl_last * dM + P_last * dZ
            dpl_last = -tl.sum(tl.sum(dM * Z, 1), 0)
            dP_last = tl.sum(tl.sum(dZ * Z, 1), 0)
            # through Z' = P_n Z0 + U^T diag(kz) X
            UdZ = tl.dot(U, dZ, input_precision=PREC)
            dU += kz[:, None] * tl.dot(X, tl.trans(dZ), input_precision=PREC)
            dX += kz[:, None] * UdZ
            dkz = tl.sum(UdZ * X, 1)
        else:
            dZ0 = dM0
        # -- through the anchored errors U -------------------------------------------------------
        if L2:
            dX += tl.dot(dU, M, input_precision=PREC)
            dM0 += tl.dot(tl.trans(dU), X, input_precision=PREC)
        dV = -dU

        # -- coefficient matrices ----------------------------------------------------------------
        if MOMENTUM:
            dKZ = tl.dot(tl.trans(Lr), dKr, input_precision=PREC) + llast[:, None] * dk[None, :]
            dLr = tl.dot(dKr, tl.trans(KZ), input_precision=PREC) + dPLr[:, None] * P[None, :]
            dllast = tl.sum(KZ * dk[None, :], 1) + dpl_last * P
            dP = tl.sum(Lr * dPLr[:, None], 0) + dpl_last * llast
            dWp = tl.dot(tl.trans(Ed), dKZ, input_precision=PREC) + elast[:, None] * dkz[None, :]
            dEd = tl.dot(dKZ, tl.trans(Wp), input_precision=PREC)
            delast = tl.sum(Wp * dkz[None, :], 1)
            # eta, in log space: E[t, j] = exp(ce_t - ce_j), P = exp(ce), elast = exp(ce_n - ce)
            GE = dEd * Ed
            Ge = delast * elast
            dce = tl.sum(GE, 1) - tl.sum(GE, 0) + dP * P - Ge
            dce_last = tl.sum(Ge, 0) + dP_last * P_last
            dle = _revcumsum(dce) + dce_last
            de = tl.where(e > 1e-30, dle / e, 0.0)
            tl.store(deta + tok, de, mask=tmask)
        else:
            dWp = tl.dot(tl.trans(Lr), dKr, input_precision=PREC) + llast[:, None] * dk[None, :]
            dLr = tl.dot(dKr, tl.trans(Wp), input_precision=PREC)
            dllast = tl.sum(Wp * dk[None, :], 1)
        # alpha, in log space: Lr[t, j] = exp(r_t - b_j), Ar = exp(r), llast = exp(b_n - b)
        GL = dLr * Lr
        Gl = dllast * llast
        drow = tl.sum(GL, 1) + dAr * Ar
        db = drow - tl.sum(GL, 0) - Gl
        db_last = tl.sum(Gl, 0) + dA_last * A_last
        dla = _revcumsum(db) + db_last
        if BEFORE:
            dla -= drow  # r = b - log alpha
        da = tl.where(a > 1e-30, dla / a, 0.0)
        tl.store(dalpha + tok, da, mask=tmask)
        # Wp = theta[:, None] * band * gamma[None, :]
        bg = band * g[None, :]
        dth = tl.sum(dWp * bg, 1)
        dg = tl.sum(dWp * band * th[:, None], 0)
        tl.store(dtheta + tok, dth, mask=tmask)
        dband = dWp * th[:, None] * g[None, :]
        for d in range(W):
            dlag_acc += tl.where(rw == d, tl.sum(tl.sum(tl.where(dist == d, dband, 0.0), 1), 0), 0.0)

        # -- stores ------------------------------------------------------------------------------
        tl.store(dpsi + tok[:, None] * DK + rk[None, :], dXq, mask=tmask[:, None] & mk[None, :])
        own = emask & (rm >= W - 1)  # this chunk's own tokens
        tl.store(dxk + ext[:, None] * DK + rk[None, :], dX, mask=own[:, None] & mk[None, :])
        tl.store(dxv + ext[:, None] * DV + rv[None, :], dV, mask=own[:, None] & mv[None, :])
        tl.store(dxg + ext, dg, mask=own)
        head = rm < W - 1  # the c - 1 rows before the chunk
        hrow = (pid * NT + i) * HW + rm
        tl.store(dhk + hrow[:, None] * DK + rk[None, :], dX, mask=head[:, None] & mk[None, :])
        tl.store(dhv + hrow[:, None] * DV + rv[None, :], dV, mask=head[:, None] & mv[None, :])
        tl.store(dhg + hrow, dg, mask=head)
        dM = dM0
        dZ = dZ0

    tl.store(dm0 + pid * DV * DK + st_off, dM, mask=st_mask)
    if MOMENTUM:
        tl.store(dz0 + pid * DV * DK + st_off, dZ, mask=st_mask)
    tl.store(dlag + pid * BW + rw, dlag_acc)


def chunk_linear_backward(ctx, dy, dM, dZ):
    """Launch the backward kernel; returns the gradients of ChunkLinearFn.forward's tensor inputs
    ``(dpsi, dxk, dxv, dxg, dalpha, dtheta, deta, dlag, dm0, dz0)``, in their dtypes."""
    cfg = ctx.cfg
    psi, xk, xv, xg, alpha, theta, eta, lag, m_chk, z_chk = ctx.saved_tensors
    B, H, T, DK, DV = ctx.shapes
    BH, C, c = B * H, cfg.chunk_size, cfg.window
    NT = m_chk.shape[1]
    TE, HW = T + c - 1, max(c - 1, 1)
    dev = psi.device
    f32 = dict(dtype=torch.float32, device=dev)
    dy = torch.zeros(BH, T, DV, **f32) if dy is None else dy.reshape(BH, T, DV).contiguous()
    dmT = torch.zeros(BH, DV, DK, **f32) if dM is None else dM.reshape(BH, DV, DK).float().contiguous()
    dzT = dmT
    if cfg.momentum:
        dzT = torch.zeros(BH, DV, DK, **f32) if dZ is None else dZ.reshape(BH, DV, DK).float().contiguous()
    NV = cfg.programs(DV, backward=True)  # value blocks: gradients summed over value dims come per block
    dpsi = torch.empty(NV, BH, T, DK, **f32)
    dxk = torch.zeros(NV, BH, TE, DK, **f32)
    dxv = torch.zeros(BH, TE, DV, **f32)
    dxg = torch.zeros(NV, BH, TE, **f32)
    dhk = torch.zeros(NV, BH, NT, HW, DK, **f32)
    dhv = torch.zeros(BH, NT, HW, DV, **f32)
    dhg = torch.zeros(NV, BH, NT, HW, **f32)
    dalpha = torch.empty(NV, BH, T, **f32)
    dtheta = torch.empty(NV, BH, T, **f32)
    deta = torch.empty(NV, BH, T, **f32) if cfg.momentum else dalpha
    dm0 = torch.empty(BH, DV, DK, **f32)
    dz0 = torch.empty(BH, DV, DK, **f32) if cfg.momentum else dm0
    BW = max(2, triton.next_power_of_2(c))
    dlag = torch.zeros(NV, BH, BW, **f32)
    with device_guard(psi):
        chunk_linear_bwd_kernel[(BH, NV)](
            psi, xk, xv, xg, alpha, theta, eta, lag, m_chk, z_chk, dy, dmT, dzT,
            dpsi, dxk, dxv, dxg, dhk, dhv, dhg, dalpha, dtheta, deta, dm0, dz0, dlag,
            T, NT, DK, DV, C, c, BW=BW, **cfg.launch(backward=True),
        )
    dpsi, dxk, dxg, dhk, dhg, dalpha, dtheta, deta, dlag = (
        x.sum(0) if NV > 1 else x[0] for x in (dpsi, dxk, dxg, dhk, dhg, dalpha, dtheta, deta, dlag)
    )
    if c > 1:  # fold in the gradients of each chunk's c - 1 look-back rows
        pos = (torch.arange(NT, device=dev) * C)[:, None] + torch.arange(c - 1, device=dev)[None, :]
        pos = pos.flatten()
        dxk.index_add_(1, pos, dhk[:, :, : c - 1].flatten(1, 2))
        dxv.index_add_(1, pos, dhv[:, :, : c - 1].flatten(1, 2))
        dxg.index_add_(1, pos, dhg[:, :, : c - 1].flatten(1, 2))

    def out(x, like, shape):
        return x.view(*shape).to(like.dtype)

    grads = (
        out(dpsi, psi, (B, H, T, DK)),
        out(dxk, xk, (B, H, TE, DK)),
        out(dxv, xv, (B, H, TE, DV)),
        out(dxg, xg, (B, H, TE)),
        out(dalpha, alpha, (B, H, T)),
        out(dtheta, theta, (B, H, T)),
        out(deta, eta, (B, H, T)) if cfg.momentum else None,
        dlag.sum(0)[:c],
        dm0.view(B, H, DV, DK).to(ctx.state_dtype),
        dz0.view(B, H, DV, DK).to(ctx.state_dtype) if cfg.momentum else None,
    )
    return grads
