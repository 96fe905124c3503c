"""``core:chunkwise``'s linear path over whole chunks: gd or momentum on a linear memory
(docs/math.md, "Parallel forms"; the per-chunk algebra in `anchored_chunk`'s module docstring).

Per chunk of C tokens (m = C + c - 1 window-extended positions, n the chunk's last token), with
the decay kernels `linear_kernels` (K, A and, for momentum, KZ, P, PL), the carried state
``R = [M^T; Z^T]: [B H, s Dphi, Dv]`` (s = 2 for momentum, 1 for gd) and the chunk's keys Phi,
values V, queries psi:

- ``U = e(Phi M_a^T, V)``, the anchored error derivatives (M_a the block's anchor memory);
- ``y = Q R - S U`` with ``Q = [Ar . psi | -PLr . psi]`` and ``S = Kr . psi Phi^T``;
- ``R' = (Mix (x) I) R + X^T U`` with ``X = [-K_n . Phi | KZ_n . Phi]`` and
  ``Mix = [[A_n, -PL_n], [0, P_n]]``, i.e. ``M' = A_n M - PL_n Z - sum_l K[n, l] u_l phi_l^T``
  and ``Z' = P_n Z + sum_l KZ[n, l] u_l phi_l^T``.

The kernels are formed for all chunks at once (chunk-major, ``[N, B H, ...]``); Q, S and X are
formed inside the loop, one chunk at a time, from the chunk's rows of the sequence, so no
sequence-sized intermediate is written. For the l2 bias (``e = pred - v``) the loop is one
autograd function (`_Scan`) whose backward is the reverse recurrence written out: it keeps the
chunk-start states and the errors U (one boundary state per chunk), recomputes each chunk's Q, S,
X, and writes the gradients of the sequence and of the kernels straight into their buffers. A
backward pass that builds a graph (``create_graph``, double backward) runs the chunk steps
through autograd instead. Other biases, and the recomputation settings of `recompute.scan`, run
the same chunk steps (`chunk_step`) through autograd.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from .anchored_chunk import chunk_stack, window_chunks, window_matrix
from .decay import drop_negligible


def kernel_rows(a, e, w, rows, m: int):
    """The rows of the decay kernels of gd / momentum by the recurrences they solve,
    ``KZ_t = eta_t KZ_{t-1} + theta_t Wm_t``, ``K_t = alpha_t K_{t-1} + KZ_t`` (``+ theta_t Wm_t``
    for gd) and ``PL_t = alpha_t PL_{t-1} + P_t``, over any leading dimensions: ``a``, ``e``
    (None for gd) the gates ``[..., C]``; ``theta_t Wm_t`` either ``w_t`` at column t (``w [...,
    C]``, a one-token window) or ``rows[t]`` (C tensors ``[..., m]``). Returns ``(Ks, KZ, P, PL)``:
    the C rows ``[..., m]`` of K, KZ's last row, eta's running product and PL (``[..., C]``;
    these three None for gd)."""
    C = a.shape[-1]
    eye = torch.eye(m, dtype=a.dtype, device=a.device)
    a_t, e_t = a.unbind(-1), (e.unbind(-1) if e is not None else None)
    w_t = w.unbind(-1) if rows is None else None
    Ks, K, KZ = [], None, None
    for t in range(C):
        new = rows[t] if rows is not None else w_t[t].unsqueeze(-1) * eye[t]  # theta_t Wm_t
        if e is not None:
            KZ = new if t == 0 else torch.addcmul(new, KZ, e_t[t].unsqueeze(-1))
            new = KZ
        K = new if t == 0 else torch.addcmul(new, K, a_t[t].unsqueeze(-1))
        Ks.append(K)
    if e is None:
        return Ks, None, None, None
    P = torch.cumprod(e, dim=-1)
    PLs, PL = [], None
    for t in range(C):  # PL_t = alpha_t PL_{t-1} + P_t: Z_0's coefficient in M_t
        PL = P[..., 0] if t == 0 else torch.addcmul(P[..., t], PL, a_t[t])
        PLs.append(PL)
    return Ks, KZ, P, torch.stack(PLs, dim=-1)


def linear_kernels(rule, p, xg, lag, C: int, c: int, T: int) -> dict:
    """The decay kernels of gd / momentum for N = T / C whole chunks, chunk-major
    (``[N, B H, ...]``): ``Kr [C, m]`` (the rows the reads use: K, or for ``read = "before"``
    K shifted down a row), ``Ar, PLr [C]`` (likewise), ``Kn, KZn [m]`` (K's and KZ's last rows),
    ``An, PLn, Pn [ ]``. K is ``L diag(theta) Wm`` for gd and ``L E diag(theta) Wm`` for momentum
    (`anchored_chunk.chunk_kernels`), formed row by row by the recurrences the matrices solve,
    ``KZ_t = eta_t KZ_{t-1} + theta_t Wm_t`` and ``K_t = alpha_t K_{t-1} + KZ_t``
    (``+ theta_t Wm_t`` for gd; `kernel_rows`): products of the gates as the token loop forms
    them, O(C m) per chunk."""
    N = T // C
    f = rule.form

    def chunked(x, value):  # [B, H, T] -> [N, B H, C]
        return chunk_stack(x, C, N, value).movedim(2, 0).flatten(1, 2).contiguous()

    a = chunked(p.alpha, 1.0)
    theta = chunked(p.gates[f.gate("step_size")], 0.0)
    momentum = f.update != "gd"
    e = chunked(p.gates[f.gate("momentum")], 1.0) if momentum else None
    if c == 1:
        w = theta * chunked(xg, 0.0) * lag[0]  # theta diag(Wm): the token's own weight
        rows = None
    else:
        g_ext = torch.stack(window_chunks(F.pad(xg, (0, N * C - T)), C, c, N * C), dim=0)
        w, rows = None, (theta.unsqueeze(-1) * window_matrix(g_ext, lag, C).flatten(1, 2)).unbind(-2)
    Ks, KZ, P, PLs = kernel_rows(a, e, w, rows, C + c - 1)
    K = Ks[-1]
    A = torch.cumprod(a, dim=-1)
    before = f.read == "before"
    if before:  # reads at M_{t-1}: the rows of t - 1 (M_{-1} = M_0: A = 1, no K, no PL)
        Ks = [torch.zeros_like(Ks[0])] + Ks[:-1]
    out = {"Kr": torch.stack(Ks, dim=-2), "Kn": K, "An": A[..., -1]}
    out["Ar"] = torch.cat([torch.ones_like(A[..., :1]), A[..., :-1]], -1) if before else A
    if momentum:
        out.update(KZn=KZ, Pn=P[..., -1], PLn=PLs[..., -1])
        out["PLr"] = torch.cat([torch.zeros_like(PLs[..., :1]), PLs[..., :-1]], -1) if before else PLs
    return {name: drop_negligible(x) for name, x in out.items()}


def _rows(x, i: int, C: int, m: int):
    """Chunk i's ``m`` rows of ``x: [B, H, T', d]`` as ``[B H, m, d]`` (a view where the layout
    allows, else a copy of those rows only)."""
    B, H = x.shape[:2]
    return x[:, :, i * C: i * C + m].reshape(B * H, m, x.shape[-1])


def _operands(xe, ps, Kr, cq, cx):
    """A chunk's ``Q [BH, C, s Dphi]``, ``S [BH, C, m]``, ``X [BH, m, s Dphi]`` and the scores
    ``psi Phi^T``, from its rows and its kernels (``cq = [Ar, -PLr]: [BH, C, s]``,
    ``cx = [-K_n, KZ_n]: [BH, m, s]``)."""
    sc = torch.bmm(ps, xe.transpose(1, 2))
    s = cq.shape[-1]
    Q = ps * cq if s == 1 else torch.cat([ps * cq[..., k:k + 1] for k in range(s)], dim=-1)
    X = xe * cx if s == 1 else torch.cat([xe * cx[..., k:k + 1] for k in range(s)], dim=-1)
    return Q, Kr * sc, X, sc


def chunk_step(R, Ma, xe, ve, ps, Kr, cq, cx, mix, error=None):
    """One chunk: ``(y [BH, C, Dv], R' [BH, s Dphi, Dv], U [BH, m, Dv])`` from the chunk-start
    state ``R`` and the anchor memory ``Ma = M_a^T [BH, Dphi, Dv]``; ``error(pred, v)`` the bias's
    error derivative (None: l2, ``pred - v``)."""
    U = torch.baddbmm(ve, xe, Ma, beta=-1.0) if error is None else error(torch.bmm(xe, Ma), ve)
    Q, S, X, _ = _operands(xe, ps, Kr, cq, cx)
    y = torch.baddbmm(torch.bmm(Q, R), S, U, alpha=-1.0)
    mixed = torch.bmm(mix, R.view(R.shape[0], mix.shape[-1], -1)).view(R.shape)
    return y, torch.baddbmm(mixed, X.transpose(1, 2), U), U


def _openers(A: int, pos: int, N: int, C: int) -> list[int]:
    """For each chunk, the chunk whose start state is its anchor memory (-1: the anchor memory
    the call started with)."""
    out, j = [], -1
    for i in range(N):
        if A == 1 or (pos + i * C) % A == 0:
            j = i
        out.append(j)
    return out


class _Scan(torch.autograd.Function):
    """The chunk loop with the l2 bias (module docstring), `chunk_step`'s operations written into
    buffers allocated once per call. ``xk, xv: [B, H, T + c - 1, .]``, ``psi: [B, H, T, Dphi]``,
    kernels ``Kr [N, BH, C, m]``, ``cq [N, BH, C, s]``, ``cx [N, BH, m, s]``, ``mix [N, BH, s, s]``
    (upper triangular); ``R0 [BH, s Dphi, Dv]``, ``anchor0`` (``M_a^T`` when the call starts
    inside a block, else None). Outputs ``y [B, H, T, Dv]``, the final R and the last chunk's
    anchor memory ``M_a^T``. Saved for the backward pass: the inputs and the chunk-start states."""

    @staticmethod
    def forward(ctx, opener, R0, anchor0, xk, xv, psi, Kr, cq, cx, mix):
        N, BH, C, m = Kr.shape
        B, H, T, Dp = psi.shape
        Dv, s = xv.shape[-1], mix.shape[-1]
        y = _like(psi, Dv)
        w = _Work(BH, C, m, s, Dp, Dv, xv)
        diag, m01 = mix.diagonal(dim1=-2, dim2=-1).unsqueeze(-1), mix[..., 0, 1:]
        R, Ma, states = R0, anchor0, []
        for i in range(N):
            if opener[i] == i:
                Ma = R[:, :Dp]
            xe, ve, ps = w.rows(xk, xv, psi, i)
            U = torch.baddbmm(ve, xe, Ma, beta=-1.0, out=w.U)
            S = torch.bmm(ps, xe.transpose(1, 2), out=w.S).mul_(Kr[i])
            Q, X = w.qx(ps, xe, cq[i], cx[i])
            torch.bmm(Q, R, out=w.y).baddbmm_(S, U, alpha=-1.0)
            y[:, :, i * C:(i + 1) * C] = w.y.view(B, H, C, Dv)
            R_next = torch.mul(R.view(BH, s, -1), diag[i]).view(R.shape)
            if s == 2:  # M' = A_n M - PL_n Z
                R_next[:, :Dp].addcmul_(R[:, Dp:], m01[i].unsqueeze(-1))
            R_next.baddbmm_(X.transpose(1, 2), U)
            states.append(R)
            R = R_next
        ctx.opener, ctx.has_anchor0 = opener, anchor0 is not None
        ctx.save_for_backward(R0, anchor0 if anchor0 is not None else R0.new_empty(0), xk, xv, psi,
                              Kr, cq, cx, mix, *states[1:])
        return y, R, Ma.clone()

    @staticmethod
    def backward(ctx, gy, gR, g_anchor):
        if torch.is_grad_enabled():  # a graph of the backward pass: through autograd
            return _Scan._backward_graph(ctx, gy, gR, g_anchor)
        R0, anchor0, xk, xv, psi, Kr, cq, cx, mix, *rest = ctx.saved_tensors
        N, BH, C, m = Kr.shape
        B, H, _, Dp = psi.shape
        states = [R0, *rest]
        Dv, sD, s = xv.shape[-1], R0.shape[1], mix.shape[-1]
        w = _Work(BH, C, m, s, Dp, Dv, xv)
        gxk, gxv, gpsi = (_like(x, x.shape[-1]).zero_() for x in (xk, xv, psi))
        gKr, gcq, gcx, gmix = (torch.empty_like(x) for x in (Kr, cq, cx, mix))
        diag, m01 = mix.diagonal(dim1=-2, dim2=-1).unsqueeze(-1), mix[..., 0, 1:]
        gR = torch.zeros_like(R0) if gR is None else gR.contiguous()
        g_anc = g_anchor  # the anchor memory's gradient, until the chunk it is the start of
        gy_i, gU, gX, gS, gQ, gps, gxe = (w.new(*shape) for shape in (
            (BH, C, Dv), (BH, m, Dv), (BH, m, sD), (BH, C, m), (BH, C, sD), (BH, C, Dp), (BH, m, Dp)))
        for i in reversed(range(N)):
            R = states[i]
            j = ctx.opener[i]
            Ma = states[j][:, :Dp] if j >= 0 else anchor0
            xe, ve, ps = w.rows(xk, xv, psi, i)
            U = torch.baddbmm(ve, xe, Ma, beta=-1.0, out=w.U)
            sc = torch.bmm(ps, xe.transpose(1, 2), out=w.sc)
            S = torch.mul(sc, Kr[i], out=w.S)
            Q, X = w.qx(ps, xe, cq[i], cx[i])
            gy_i.view(B, H, C, Dv).copy_(gy[:, :, i * C:(i + 1) * C])
            # y = Q R - S U;  R' = mix R + X^T U
            torch.bmm(X, gR, out=gU).baddbmm_(S.transpose(1, 2), gy_i, alpha=-1.0)
            torch.bmm(U, gR.transpose(1, 2), out=gX)
            torch.bmm(gy_i, U.transpose(1, 2), out=gS)  # minus the gradient of S
            torch.bmm(gy_i, R.transpose(1, 2), out=gQ)
            gRv = gR.view(BH, s, -1)
            torch.bmm(gRv, R.view(BH, s, -1).transpose(1, 2), out=gmix[i])
            g_prev = torch.mul(gRv, diag[i]).view(R.shape)
            if s == 2:
                g_prev[:, Dp:].addcmul_(gR[:, :Dp], m01[i].unsqueeze(-1))
            g_prev.baddbmm_(Q.transpose(1, 2), gy_i)
            # U = Phi M_a - V
            gMa = torch.bmm(xe.transpose(1, 2), gU)
            torch.bmm(gU, Ma.transpose(1, 2), out=gxe)
            # S = Kr . (psi Phi^T);  Q = [cq_k psi];  X = [cx_k Phi]
            torch.mul(gS, sc, out=gKr[i]).neg_()
            gsc = gS.mul_(Kr[i])  # minus the gradient of the scores
            gxe.baddbmm_(gsc.transpose(1, 2), ps, alpha=-1.0)
            torch.bmm(gsc, xe, out=gps).neg_()
            gQ4, gX4 = gQ.view(BH, C, s, Dp), gX.view(BH, m, s, Dp)
            torch.sum(torch.mul(gQ4, ps.unsqueeze(2), out=w.Q4), dim=-1, out=gcq[i])
            torch.sum(torch.mul(gX4, xe.unsqueeze(2), out=w.X4), dim=-1, out=gcx[i])
            for k in range(s):
                gps.addcmul_(gQ4[:, :, k], cq[i][..., k:k + 1])
                gxe.addcmul_(gX4[:, :, k], cx[i][..., k:k + 1])
            gxk[:, :, i * C:i * C + m] += gxe.view(B, H, m, Dp)
            gxv[:, :, i * C:i * C + m] -= gU.view(B, H, m, Dv)
            gpsi[:, :, i * C:(i + 1) * C] = gps.view(B, H, C, Dp)
            g_anc = gMa if g_anc is None else g_anc + gMa
            if j == i:  # the anchor memory is this chunk's start state
                g_prev[:, :Dp] += g_anc
                g_anc = None
            gR = g_prev
        grads = (gR, g_anc if ctx.has_anchor0 else None, gxk, gxv, gpsi, gKr, gcq, gcx, gmix)
        return (None, *(g if n else None for g, n in zip(grads, ctx.needs_input_grad[1:])))

    @staticmethod
    def _backward_graph(ctx, gy, gR, g_anchor):
        R0, anchor0, xk, xv, psi, Kr, cq, cx, mix, *_ = ctx.saved_tensors
        inputs = [R0, anchor0 if ctx.has_anchor0 else None, xk, xv, psi, Kr, cq, cx, mix]
        need = ctx.needs_input_grad[1:]
        with torch.enable_grad():  # the saved inputs carry their history: a graph to them
            y, R, Ma = _loop(ctx.opener, *inputs)
            wrt = [x for x, n in zip(inputs, need) if n]
            outs = [(o, g) for o, g in ((y, gy), (R, gR), (Ma, g_anchor))
                    if g is not None and o.requires_grad]
            got = iter(torch.autograd.grad([o for o, _ in outs], wrt, [g for _, g in outs],
                                           create_graph=True, allow_unused=True)
                       if outs and wrt else [None] * len(wrt))
        return (None, *(next(got) if n else None for n in need))


def _like(x, d: int):
    """An empty ``[B, H, T, d]`` tensor laid out as ``x`` is (``[B, T, H, d]`` in memory where x is
    a view of that layout, as the rule's inputs are): no copy where it is handed on."""
    B, H, T = x.shape[:3]
    if H > 1 and T > 1 and x.stride(1) < x.stride(2):
        return x.new_empty(B, T, H, d).transpose(1, 2)
    return x.new_empty(B, H, T, d)


class _Work:
    """One chunk's working tensors for `_Scan`, allocated once per call and overwritten chunk
    after chunk (a chunk's rows are copied in: the sequence's layout need not allow a view)."""

    def __init__(self, BH, C, m, s, Dp, Dv, like):
        self.new = lambda *shape: like.new_empty(shape)
        self.C, self.m = C, m
        self.xe, self.ve, self.ps = self.new(BH, m, Dp), self.new(BH, m, Dv), self.new(BH, C, Dp)
        self.U, self.y = self.new(BH, m, Dv), self.new(BH, C, Dv)
        self.S, self.sc = self.new(BH, C, m), self.new(BH, C, m)
        self.Q4, self.X4 = self.new(BH, C, s, Dp), self.new(BH, m, s, Dp)

    def rows(self, xk, xv, psi, i):
        """Chunk i's keys, values and queries: ``[BH, m, Dphi], [BH, m, Dv], [BH, C, Dphi]``."""
        C, m = self.C, self.m
        B, H = psi.shape[:2]
        for buf, x, n in ((self.xe, xk, m), (self.ve, xv, m), (self.ps, psi, C)):
            buf.view(B, H, n, x.shape[-1]).copy_(x[:, :, i * C:i * C + n])
        return self.xe, self.ve, self.ps

    def qx(self, ps, xe, cq, cx):
        """``Q = [cq_k psi]: [BH, C, s Dphi]`` and ``X = [cx_k Phi]: [BH, m, s Dphi]``."""
        torch.mul(ps.unsqueeze(2), cq.unsqueeze(-1), out=self.Q4)
        torch.mul(xe.unsqueeze(2), cx.unsqueeze(-1), out=self.X4)
        return self.Q4.flatten(2), self.X4.flatten(2)


def _chunks(x, N: int, C: int, m: int):
    """``x: [B, H, T', d]`` -> N tensors ``[B H, m, d]`` (chunk i: rows iC .. iC + m - 1), cut by
    one op (split, or unfold for overlapping windows): one backward op, not one per chunk."""
    B, H, _, d = x.shape
    if m == C:
        return [c.reshape(B * H, C, d) for c in x[:, :, :N * C].split(C, dim=2)]
    win = x.unfold(2, m, C).movedim(-1, 3)  # [B, H, N, m, d]
    return [c.reshape(B * H, m, d) for c in win.unbind(2)]


def _loop(opener, R0, anchor0, xk, xv, psi, Kr, cq, cx, mix, error=None, scan=None):
    """The chunk loop through autograd (`_Scan`'s forward for a backward pass that builds a graph,
    and any bias): ``(y [B, H, T, Dv], R, M_a^T)``; ``scan``: `recompute.scan`'s settings."""
    N, BH, C, m = Kr.shape
    B, H = psi.shape[:2]
    Dp, Dv = xk.shape[-1], xv.shape[-1]
    names = ("xe", "ve", "ps", "Kr", "cq", "cx", "mix")
    pieces = (_chunks(xk, N, C, m), _chunks(xv, N, C, m), _chunks(psi, N, C, C), Kr.unbind(0),
              cq.unbind(0), cx.unbind(0), mix.unbind(0))
    inputs = [dict(zip(names, t)) for t in zip(*pieces)]

    def body(i, carry, inp):
        R = carry["R"]
        Ma = R[:, :Dp] if opener[i] == i else carry["anchor"]
        y, R, _ = chunk_step(R, Ma, *(inp[k] for k in names), error)
        return y.view(B, H, C, Dv), {"R": R, "anchor": Ma}

    carry = {"R": R0} | ({"anchor": anchor0} if anchor0 is not None else {})
    if scan is None:
        ys = []
        for i, inp in enumerate(inputs):
            y, carry = body(i, carry, inp)
            ys.append(y)
    else:
        ys, carry = scan(body, carry, inputs)
    return torch.cat(ys, dim=2), carry["R"], carry["anchor"]


def linear_scan(rule, p, xk, xv, xg, lag, C: int, M0, Z0, anchor0, pos: int, scan=None):
    """The linear path over a call of N whole chunks (T = N C): ``(y [B, H, T, Dv], M, Z, anchor)``;
    ``Z`` is None for gd, ``anchor`` the memory the last chunk took its gradients at
    (``[B, H, Dv, Dphi]``). ``xk, xv, xg`` from ``rule.extended_inputs``; ``anchor0`` the anchor
    memory when the call starts inside a block (``pos`` tokens in), else None. ``scan(body, carry,
    inputs)``: run the chunks through `recompute.scan` with these settings (None: `_Scan` where the
    bias is l2)."""
    f = rule.form
    B, H, T = p.shape
    c, A = f.window, f.anchor
    N = T // C
    BH, Dv, Dp = B * H, M0.shape[-2], M0.shape[-1]
    kern = linear_kernels(rule, p, xg, lag, C, c, T)
    momentum = "KZn" in kern
    s = 2 if momentum else 1
    if momentum:
        cq = torch.stack([kern["Ar"], -kern["PLr"]], dim=-1)  # [N, BH, C, 2]
        cx = torch.stack([-kern["Kn"], kern["KZn"]], dim=-1)  # [N, BH, m, 2]
        An = kern["An"]
        mix = torch.stack([An, -kern["PLn"], torch.zeros_like(An), kern["Pn"]], dim=-1).unflatten(-1, (2, 2))
    else:
        cq, cx, mix = kern["Ar"].unsqueeze(-1), -kern["Kn"].unsqueeze(-1), kern["An"][..., None, None]
    R0 = (torch.cat([M0, Z0], dim=-1) if momentum else M0).transpose(-1, -2).contiguous().view(BH, s * Dp, Dv)
    a0 = None if anchor0 is None else anchor0.transpose(-1, -2).reshape(BH, Dp, Dv)
    opener = _openers(A, pos, N, C)
    args = (R0, a0, xk, xv, p.psi, kern["Kr"], cq, cx, mix)
    if scan is None and f.error == "l2":
        y, R, Ma = _Scan.apply(opener, *args)
    else:
        m = C + c - 1

        def error(pred, v):
            return rule.bias.error(pred.view(B, H, m, Dv), v.view(B, H, m, Dv)).view(BH, m, Dv)

        y, R, Ma = _loop(opener, *args, error=None if f.error == "l2" else error, scan=scan)
    St = R.view(B, H, s * Dp, Dv).transpose(-1, -2)  # [B, H, Dv, s Dphi]
    M = St[..., :Dp].contiguous()
    Z = St[..., Dp:].contiguous() if momentum else None
    anchor = Ma.reshape(B, H, Dp, Dv).transpose(-1, -2).contiguous() if A > 1 else None
    return y, M, Z, anchor
