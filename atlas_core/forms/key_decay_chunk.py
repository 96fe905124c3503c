"""Per-key decay, exact for any chunk size: ``core:exact_chunk``'s form for GLA and KDA.

The rule (docs/math.md, "Exact chunked forms", (e)): gd on a linear memory ``M: [Dv, Dk]``, a
one-token window, a retain factor per key dimension ``a_t: [Dk]`` (a scalar factor is the same with
every entry equal) and token weight ``w_t = theta_t gamma_t lag[0]``:

    M'_t = M_{t-1} Diag(a_t)
    e_t  = M_{t-1} k_t - v_t  (l2, gradient "current"),  M'_t k_t - v_t  (l2, "retained"),  -v_t  (dot)
    M_t  = M'_t - w_t e_t k_t^T

Inside a chunk that starts from ``S`` with ``b_t = sum_{m<=t} log a_m`` (per key, from the chunk's
start; ``b_{-1} = 0``) and ``Gamma_t = exp(b_t)``, every step unrolls to

    M_t = S Diag(Gamma_t) - sum_{j<=t} w_j e_j (k_j * exp(b_t - b_j))^T.

So with ``r_j`` the log-decay at which token j's error is taken (``b_{j-1}`` current, ``b_j``
retained) the errors solve the unit lower-triangular system

    e_j + sum_{i<j} w_i [sum_d k_{j,d} k_{i,d} exp(r_{j,d} - b_{i,d})] e_i = S (exp(r_j) * k_j) - v_j

(none for dot: e = -v), and the reads (``r = b_t``, ``i <= t`` after; ``b_{t-1}``, ``i < t``
before) and the next chunk's state are

    y_t    = S (exp(r_t) * q_t) - sum_i w_i [sum_d q_{t,d} k_{i,d} exp(r_{t,d} - b_{i,d})] e_i
    S_next = S Diag(exp(b_C)) - sum_j w_j e_j (k_j * exp(b_C - b_j))^T.

Numerics: no ratio ``Gamma_t / Gamma_i`` of two cumulative products over a whole chunk is ever
formed (it overflows once a chunk decays by more than ~1e38, e.g. 64 tokens at a = 0.25 in
float32). The score matrices ``sum_d x_{t,d} y_{i,d} exp(r_{t,d} - b_{i,d})`` (`decayed_scores`)
go through the log-decay ``rho_I`` at the token before each row sub-block I of s tokens:
``exp(r_t - rho_I) exp(rho_I - b_i)``, one matrix product per sub-block. s is the largest of C,
64, 32, 16, 8 over which no key decays by more than e^30 (float32; e^300 in float64), so both
factors stay within ``exp(+-30)``; where even 8 tokens decay further (gates near or at 0) the
exponents inside each diagonal sub-block are formed pairwise (``r_t - b_i <= 0``) and those across
sub-blocks as two factors ``<= 1``. Every other exponent (reads, state update) is a segment sum
``<= 0``.

Cost per chunk of C tokens, d = Dk = Dv, sub-block s: about ``C^2 d`` multiply-adds and
``C^2 d / s`` exponentials for each of the two score matrices (the pairwise fallback: ``C s d``
more of both), ``C^2 (d + Dv) / 2`` for the solve (l2
only) and ``3 C d Dv`` for the memory products.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from .decay import drop_negligible, log_tiny
from .exact_chunk import unit_lower_solve

BLOCK = 16  # sub-block of the score matrices (tokens)


def _pad_rows(x: torch.Tensor, n: int, value: torch.Tensor | None = None) -> torch.Tensor:
    """``x [..., C, D]`` with n rows appended: zeros, or ``value [..., 1, D]`` repeated."""
    if not n:
        return x
    tail = x.new_zeros(*x.shape[:-2], n, x.shape[-1]) if value is None else value.expand(
        *x.shape[:-2], n, x.shape[-1])
    return torch.cat([x, tail], dim=-2)


def decayed_scores(rows, r, cols, b, *, strict: bool, block: int | None = None) -> torch.Tensor:
    """``out[..., t, i] = sum_d rows[t, d] cols[i, d] exp(r[t, d] - b[i, d])`` for ``i < t``
    (``strict``) or ``i <= t``, else 0. All inputs ``[..., C, D]``; ``b`` is a running sum of
    log-gates (non-increasing along C) and every row's ``r[t] <= b[t - 1]`` holds (``r = b`` or
    ``b`` shifted down by one), so every exponent formed is ``<= 0`` (see the module docstring).

    ``block = None`` picks the form from the data: the largest sub-block s (C, 64, 32, 16 or 8)
    over which no key decays by more than `_RANGE` (``e^30`` in float32), so that the factored
    form (`_factored`: one matrix product per row sub-block) neither overflows nor underflows;
    where even 8 tokens decay further (gates near 0), the pairwise form (`_pairwise`) with
    sub-blocks of `BLOCK`. An integer ``block`` forces the pairwise form with that sub-block."""
    C = rows.shape[-2]
    if block is None:
        limit = _RANGE.get(b.dtype, _RANGE[torch.float32])
        for s in (C, 64, 32, 16, 8):
            if s > C:
                continue
            if _max_range(b, s) < limit:
                return _factored(rows, r, cols, b, strict, s)
        block = BLOCK
    return _pairwise(rows, r, cols, b, strict, block)


#: the largest decay of one key over one sub-block the factored form takes, in log space: both of
#: its factors then stay within exp(+-limit), far from overflow and underflow
_RANGE = {torch.float64: 300.0, torch.float32: 30.0, torch.bfloat16: 30.0, torch.float16: 5.0}


def _blocked(x: torch.Tensor, s: int, value: torch.Tensor | None = None) -> tuple[torch.Tensor, int]:
    """``x [..., C, D]`` padded to whole sub-blocks of s rows (zeros, or ``value`` repeated)."""
    C = x.shape[-2]
    P = -(-C // s) * s - C
    return _pad_rows(x, P, value), P


def _max_range(b: torch.Tensor, s: int) -> float:
    """The largest decay, ``b`` at the token before a sub-block minus ``b`` at its last token,
    over every sub-block of s tokens, key and chunk (0 for no decay)."""
    bb, _ = _blocked(b, s, b[..., -1:, :])
    ends = bb[..., s - 1 :: s, :]
    starts = torch.cat([torch.zeros_like(ends[..., :1, :]), ends[..., :-1, :]], dim=-2)
    return float((starts - ends).detach().max()) if ends.numel() else 0.0


def _factored(rows, r, cols, b, strict: bool, s: int) -> torch.Tensor:
    """`decayed_scores` through the log-decay ``rho_I`` at the token before each row sub-block
    I: ``exp(r_t - b_i) = exp(r_t - rho_I) exp(rho_I - b_i)``, one product per sub-block over
    the columns up to the sub-block's end; both factors lie in ``[exp(-range), exp(range)]``."""
    C, D = rows.shape[-2:]
    last = b[..., -1:, :]
    rows, P = _blocked(rows, s)
    cols, _ = _blocked(cols, s)
    r, _ = _blocked(r, s, last)
    b, _ = _blocked(b, s, last)
    Cp = rows.shape[-2]
    nb = Cp // s
    bb = b.unflatten(-2, (nb, s))
    rho = torch.cat([torch.zeros_like(b[..., :1, :]), bb[..., :-1, -1, :]], dim=-2)  # [.., nb, D]
    left = rows.unflatten(-2, (nb, s)) * torch.exp(r.unflatten(-2, (nb, s)) - rho.unsqueeze(-2))
    t = torch.arange(Cp, device=rows.device)
    upto = t[None, :] < (torch.arange(1, nb + 1, device=rows.device) * s)[:, None]  # [nb, Cp]
    ex = torch.exp((rho.unsqueeze(-2) - b.unsqueeze(-3)).masked_fill(~upto[:, :, None], float("-inf")))
    out = (left @ (cols.unsqueeze(-3) * ex).transpose(-1, -2)).flatten(-3, -2)  # [.., Cp, Cp]
    keep = (t[:, None] > t[None, :]) if strict else (t[:, None] >= t[None, :])
    out = out.masked_fill(~keep, 0.0)
    return out[..., :C, :C] if P else out


def _pairwise(rows, r, cols, b, strict: bool, block: int) -> torch.Tensor:
    """`decayed_scores` with every exponent formed as ``r_t - b_i`` inside diagonal sub-blocks
    of ``block`` tokens (``s^2 D`` per sub-block), and across sub-blocks as the product of two
    factors ``<= 1`` through the log-decay at the row sub-block's start: safe for any gates."""
    C, D = rows.shape[-2:]
    s = max(1, min(block, C))
    nb = -(-C // s)
    P = nb * s - C
    last = b[..., -1:, :]  # padding: zero rows/columns at the last log-decay (exponents stay <= 0)
    rows, cols = _pad_rows(rows, P), _pad_rows(cols, P)
    r, b = _pad_rows(r, P, last), _pad_rows(b, P, last)
    Cp = nb * s
    lead = rows.shape[:-2]
    # within each diagonal sub-block: pairwise exponents [.., nb, s, s, D]
    rb, bb = r.unflatten(-2, (nb, s)), b.unflatten(-2, (nb, s))
    seg = rb.unsqueeze(-2) - bb.unsqueeze(-3)  # [.., nb, t, i, D]
    i = torch.arange(s, device=rows.device)
    keep = (i[:, None] > i[None, :]) if strict else (i[:, None] >= i[None, :])
    ex = torch.exp(seg.masked_fill(~keep[:, :, None], float("-inf")))
    diag = torch.einsum("...ntd,...nid,...ntid->...nti", rows.unflatten(-2, (nb, s)),
                        cols.unflatten(-2, (nb, s)), ex)  # [.., nb, s, s]
    if nb == 1:
        out = diag.reshape(*lead, Cp, Cp)
    else:
        # across sub-blocks, through rho_I = b at the last token before sub-block I (0 for I = 0)
        rho = torch.cat([torch.zeros_like(b[..., :1, :]), bb[..., :-1, -1, :]], dim=-2)  # [.., nb, D]
        left = rows.unflatten(-2, (nb, s)) * torch.exp(rb - rho.unsqueeze(-2))  # [.., nb, s, D]
        before = torch.arange(Cp, device=rows.device)[None, :] < (torch.arange(nb, device=rows.device) * s)[:, None]
        ex_r = torch.exp((rho.unsqueeze(-2) - b.unsqueeze(-3)).masked_fill(~before[:, :, None], float("-inf")))
        right = cols.unsqueeze(-3) * ex_r  # [.., nb, Cp, D]: column i < I s of sub-block I
        off = left @ right.transpose(-1, -2)  # [.., nb, s, Cp]
        eye = torch.eye(nb, dtype=diag.dtype, device=diag.device)
        out = (off.unflatten(-1, (nb, s)) + diag.unsqueeze(-2) * eye[:, None, :, None]).reshape(*lead, Cp, Cp)
    return out[..., :C, :C] if P else out


def run_key_decay(rule, p, chunk_size: int):
    """``core:exact_chunk`` on a gd rule with a one-token window, the l2 or dot bias and a
    per-key (or scalar, broadcast) retain factor: ``(y [B, H, T, Dv], final state)``."""
    B, H, T = p.shape
    S = p.state["M"]  # [B, H, Dv, Dk]
    Dv, Dk = S.shape[-2:]
    if T == 0:
        return p.v.new_zeros(B, H, 0, Dv), rule.final_state({"M": S}, {}, p.phik, p.v, p.gamma)
    C = max(1, min(chunk_size, T))
    N = -(-T // C)
    pad = N * C - T  # padded tokens: k = q = v = 0, w = 0, alpha = 1 (they change nothing)
    f = rule.form
    l2 = f.error == "l2"
    retained = f.gradient_at == "retained"
    after = f.read == "after"
    alpha = p.alpha if f.retention_shape == "key" else p.alpha.unsqueeze(-1).expand(B, H, T, Dk)
    la = F.pad(log_tiny(alpha), (0, 0, 0, pad))  # enters running sums: floored at log(tiny)
    b = la.unflatten(2, (N, C)).cumsum(-2)  # b_t from the chunk's start: [B, H, N, C, Dk]
    bp = torch.cat([torch.zeros_like(b[..., :1, :]), b[..., :-1, :]], dim=-2)  # b_{t-1}
    lag0 = rule.bias.lag_weights(p.v.dtype, p.v.device)[0]
    w = F.pad(p.gates[f.gate("step_size")] * p.gamma * lag0, (0, pad)).unflatten(-1, (N, C))  # [B, H, N, C]

    def chunks(x):
        return F.pad(x, (0, 0, 0, pad)).unflatten(2, (N, C))

    X, V, Q = chunks(p.phik), chunks(p.v), chunks(p.psi)  # [B, H, N, C, .]
    Xw = w.unsqueeze(-1) * X
    rq = b if after else bp
    # the loop's operands lose their negligible entries (`decay.decay_floor`)
    Pm = drop_negligible(decayed_scores(Q, rq, Xw, b, strict=not after))  # the reads' weights of the errors
    Qr = drop_negligible(Q * torch.exp(rq))
    bC = b[..., -1:, :]  # the chunk's total log-decay (padded tokens add 0)
    Dn = drop_negligible(Xw * torch.exp(bC - b)).transpose(-1, -2)  # [B, H, N, Dk, C]
    gC = drop_negligible(torch.exp(bC)).transpose(-1, -2)  # [B, H, N, Dk, 1]: S Diag(exp(b_C)), transposed
    if l2:
        rs = b if retained else bp
        Nm = decayed_scores(X, rs, Xw, b, strict=True)
        Wsol, U = unit_lower_solve(Nm, X * torch.exp(rs), V)  # E = Wsol S^T - U
        Wsol = drop_negligible(Wsol)

    def flat(x):
        return x.flatten(0, 1).unbind(1)  # [B H, ...] per chunk

    St = S.flatten(0, 1).transpose(-1, -2)  # S^T: [B H, Dk, Dv]
    parts = (flat(Qr), flat(Pm), flat(Dn), flat(gC)) + ((flat(Wsol), flat(U)) if l2 else (flat(-V),))
    ys = []
    for Qn, Pn, Dnn, gn, *err in zip(*parts):
        En = torch.baddbmm(err[1], err[0], St, beta=-1) if l2 else err[0]  # errors [B H, C, Dv]
        ys.append(torch.baddbmm(torch.bmm(Qn, St), Pn, En, alpha=-1))
        St = torch.baddbmm(gn * St, Dnn, En, alpha=-1)
    y = torch.stack(ys, dim=1).view(B, H, N * C, Dv)
    if pad:
        y = y[:, :, :T]
    M = St.transpose(-1, -2).unflatten(0, (B, H)).contiguous()
    return y, rule.final_state({"M": M}, {}, p.phik, p.v, p.gamma)
