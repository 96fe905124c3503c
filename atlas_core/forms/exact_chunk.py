"""The per-token delta rule in chunks, exact for any chunk size (WY / UT transform): the form
``core:exact_chunk`` runs (`run_exact`; per-key decay and the dot bias: `key_decay_chunk`).

Runs gd or momentum (Titans) on a linear memory with the l2 bias, or with an Omega window of c
tokens around it, under scalar-decay retention (``core:decay`` / ``core:none``), read "after" or
"before". The result equals ``core:sequential`` (the rule's reference loop, every gradient at the
true memory ``M_{t-1}``) up to rounding for every chunk size C; autograd differentiates through
everything, the triangular solve included.

The rule (k = phi(k), q = phi(q); an extended position l runs over the c - 1 carried window tokens
and then the call's tokens; lag[0] weighs the current token):

    g_t = sum_{s<c} w[t, s] (M_{t-1} x_{t,s} - v_{t,s}) x_{t,s}^T,
    w[t, s] = theta_t gamma_{l} lag[t - l],  x_{t,s} = k_l, v_{t,s} = v_l,  l = t - (c - 1) + s
    gd:        M_t = alpha_t M_{t-1} - g_t
    momentum:  Z_t = eta_t Z_{t-1} + g_t,  M_t = alpha_t M_{t-1} - Z_t

(c = 1: w[t, 0] = theta_t gamma_t lag[0]). Inside a chunk of C tokens that starts from (S, Z0),
with the decay matrices (`decay.decay_matrix`) ``L`` of alpha and ``E`` of eta, ``A_t = prod
alpha``, ``P_t = prod eta``, ``K = L`` and ``PL = 0`` for gd, ``K = L E`` and ``PL = L P`` for
momentum, both algorithms unroll to

    M_t = A_t S - PL_t Z0 - sum_{j<=t} K[t, j] g_j,   Z_t = P_t Z0 + sum_{j<=t} E[t, j] g_j.

The unknowns are the C c errors ``e_{j,s} = M_{j-1} x_{j,s} - v_{j,s}`` at the true memory. With
``K'[t, j] = K[t-1, j]`` (the rows of M_{t-1}: strictly lower) and A', PL' shifted likewise they
solve one unit lower-triangular system of size C c (block lower-triangular by token: the c errors
of one token are all at M_{j-1}, so they do not couple):

    e_{j,s} + sum_{i<j, r} K'[j, i] w[i, r] (x_{j,s} . x_{i,r}) e_{i,r} = (A'_j S - PL'_j Z0) x_{j,s} - v_{j,s}
    (I + N) E = A' X S^T - PL' X Z0^T - V   =>   E = W_S S^T - W_Z Z0^T - U

(the UT transform: ``I + N`` does not depend on the memory, so ``W_S, W_Z, U`` come out of one
batched triangular solve). The reads, with ``R = K, A, PL`` for "after" and ``K', A', PL'`` for
"before" and ``Pm[t, (j,s)] = R[t, j] w[j, s] (q_t . x_{j,s})``, and the next chunk's state are

    y      = A Q S^T - PL Q Z0^T - Pm E
    S_next = A_C S - PL_C Z0 - E^T diag(K[C, j] w[j, s]) X
    Z_next = P_C Z0 + E^T diag(E[C, j] w[j, s]) X.

Everything that does not involve the memory (decay matrices, Gram matrices, ``N``, ``Pm``, the
solve, the per-row scalings of X and Q) is formed for all chunks at once; the solve is posed
right-sided (``X (I + N)^T = R^T``), the layout LAPACK's trsm takes without a copy. The loop over
chunks keeps the state transposed, ``St = [S^T ; Z0^T]: [2 Dk, Dv]`` (gd: ``S^T``), so that each
chunk is four plain products and one small one, all independent of T:

    E    = [W_S | -W_Z] St - U                      (C c x 2 Dk) @ (2 Dk x Dv)
    y    = [A Q | -PL Q] St - Pm E
    St'  = [[A_C, -PL_C], [0, P_C]] St + [D_S | D_Z]^T E      (the 2 x 2 map: one [2, 2] bmm)

with ``D_S = -diag(K[C, j] w) X``, ``D_Z = diag(E[C, j] w) X``. Only the state at chunk
boundaries is kept. The last chunk is padded to C tokens (k = v = 0, theta = 0, alpha = eta = 1)
and its end-of-chunk coefficients are taken at its last real token, so the final state is exact
(a padded token would still move a momentum's memory). For c > 1 the (C c)^2 Gram matrix is
gathered (unfold) from the (C + c - 1)^2 one of the chunk's distinct keys, the read scores
likewise.

Cost per token, multiply-adds, d = Dk = Dv, c = 1: gd about ``C^2`` (decay matrix) ``+ 4 C d``
(Gram, read scores, the solve's d + Dv columns, ``Pm E``) ``+ 3 d^2``; momentum about ``3 C^2``
(two decay matrices, ``K = L E``) ``+ 4.5 C d + 6 d^2``, against ``3 C^2 + 2 C d + 5 d^2`` for
``core:chunkwise`` on the anchored rule (its anchored error needs no solve and one product with
the state fewer). Small chunks therefore suit this strategy (C = 16 to 32 at d = 64; the solve
and the C^2 terms grow with C); on a CPU, time follows the multiply-adds plus a per-chunk
overhead. A window multiplies the memory products by c and the solve by c^2 (``(C c)^2 (2 d +
Dv) / 2`` per chunk for momentum). Memory O(T C c^2 + T c d + (T / C) d^2).

Per-key decay (``alpha_shape = "key"``: GLA, KDA) and the dot bias run through
`key_decay_chunk.run_key_decay` (docs/math.md, "Exact chunked forms" (e)): gd with a one-token
window, the l2 bias (gradient at the current or the decayed memory) or the dot bias.

`run_exact` computes a rule whose form has ``"exact_chunk"`` (`atlas_core.forms.RuleForm`); the
step size and momentum gates are read by role. Tensors: ``p.psi, p.phik: [B, H, T, Dphi]``,
``p.v: [B, H, T, Dv]``, gates ``[B, H, T]``, state ``{"M": [B, H, Dv, Dphi]}`` plus ``"Z.M"``
(momentum) and ``"window.*"`` (c > 1).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F

from .decay import decay_matrix, drop_negligible
from .tril_inverse import unit_lower_inverse

#: systems of this size and more are solved by the batched inverse (`tril_inverse`): LAPACK's
#: batched trsm runs one small system at a time, several times slower from 32 up on a CPU
INVERT_FROM = 32


def shift_down(x: torch.Tensor, first: float, dim: int) -> torch.Tensor:
    """Drop the last entry along ``dim`` and put ``first`` in front (index t holds x[t - 1])."""
    head = torch.full_like(x.narrow(dim, 0, 1), first)
    return torch.cat([head, x.narrow(dim, 0, x.shape[dim] - 1)], dim=dim)


def chunk_ends(x: torch.Tensor, last: int) -> torch.Tensor:
    """Row ``C - 1`` of every chunk of ``x: [B, H, N, C, ...]`` but row ``last`` of the final one
    (the state after the call's last token: a padded token leaves a momentum's memory moving)."""
    if last == x.shape[3] - 1:
        return x[:, :, :, -1]
    return torch.cat([x[:, :, :-1, -1], x[:, :, -1:, last]], dim=2)


def pad_tokens(x: torch.Tensor, pad: int) -> torch.Tensor:
    """``x: [B, H, T, d]`` with ``pad`` zero tokens appended (no copy when there are none)."""
    return F.pad(x, (0, 0, 0, pad)) if pad else x


def _outer(coef: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
    """``[coef[..., 0] x | coef[..., 1] x]``: ``coef [..., n, 2]``, ``x [..., n, d]`` -> ``[..., n, 2 d]``
    (one product, no concatenation)."""
    return (coef.unsqueeze(-1) * x.unsqueeze(-2)).flatten(-2)


def unit_lower_solve(Nm: torch.Tensor, *Rs: torch.Tensor) -> tuple[torch.Tensor, ...]:
    """``(I + Nm)^-1 R`` for each ``R`` of ``Rs``, strictly lower ``Nm [..., n, n]`` (its diagonal
    and upper part are not read), batched. From ``n = INVERT_FROM`` the inverse is formed once
    (`tril_inverse`) and multiplies each ``R``; below, each is posed as the right-sided system
    ``X (I + Nm)^T = R^T``: the row-major layout LAPACK's trsm takes without copying, about twice
    as fast on a CPU as the left-sided form."""
    if Nm.shape[-1] >= INVERT_FROM:
        inv = unit_lower_inverse(Nm)
        return tuple(inv @ R for R in Rs)
    return tuple(torch.linalg.solve_triangular(Nm.mT, R.mT, upper=True, left=False, unitriangular=True).mT
                 for R in Rs)


def _slots(x: torch.Tensor, c: int) -> torch.Tensor:
    """Per-token window rows ``[..., C, c]`` of ``[..., C]`` coefficients, flattened to C c."""
    return x if c == 1 else x.unsqueeze(-1).expand(*x.shape, c).flatten(-2)


def run_exact(rule, p, chunk_size: int):
    """``(y [B, H, T, Dv], final state)`` of the call ``p`` (`atlas_core.rule.MemoryInputs`) of a
    rule whose form has ``"exact_chunk"``, in chunks of ``chunk_size`` tokens: the memory-independent
    pieces of every chunk at once (`exact_pieces`), then the chunk loop (`ExactPieces.loop`)."""
    B, H, T = p.shape
    mom = rule.form.momentum
    S = p.state["M"]  # [B, H, Dv, Dk]
    Dv, Dk = S.shape[-2:]
    ext = rule.extended_inputs(p)  # the carried window first: [B, H, c - 1 + T, .]
    if T == 0:
        opt = {"Z.M": p.state["Z.M"]} if mom else {}
        return p.v.new_zeros(B, H, 0, Dv), rule.final_state({"M": S}, opt, *ext)
    # The state is kept transposed, [S^T ; Z0^T]: [B, H, 2 Dk, Dv] (gd: S^T), so that every
    # product of the loop is one plain (b)addbmm and the 2 x 2 map of (S, Z0) one small bmm.
    St = (torch.cat([S, p.state["Z.M"]], dim=-1) if mom else S).transpose(-1, -2)
    y, St = exact_pieces(rule, p, chunk_size, ext).loop(St)
    SZ = St.transpose(-1, -2)
    if mom:
        W, opt = {"M": SZ[..., :Dk].contiguous()}, {"Z.M": SZ[..., Dk:].contiguous()}
    else:
        W, opt = {"M": SZ.contiguous()}, {}
    return y, rule.final_state(W, opt, *ext)


@dataclass
class ExactPieces:
    """The memory-independent pieces of the UT / WY form for every chunk of a call
    (`exact_pieces`), with the graph of whatever made them: ``W [B, H, N, C c, n]``, ``U [.., C c,
    Dv]``, ``Dn [.., n, C c]``, ``Qs [.., C, n]``, ``Pm [.., C, C c]`` and ``mix [.., K, K]``
    (n = K Dk, K = 2 with momentum). `loop` runs the call from any initial memory on them; a
    context-parallel rank also reads its slice's map from them
    (`atlas_core.distributed.state_map.chunk_maps`), so it forms them once for both."""

    W: torch.Tensor
    U: torch.Tensor
    Dn: torch.Tensor
    Qs: torch.Tensor
    Pm: torch.Tensor
    mix: torch.Tensor
    tokens: int

    def loop(self, St: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """``(y [B, H, T, Dv], St_out [B, H, n, Dv])`` of the call from the transposed initial
        memory ``St [B, H, n, Dv]``, chunk after chunk (docs/math.md, "Exact chunked forms"):
        ``E = W St - U``, ``y = Qs St - Pm E``, ``St' = (mix (x) I) St + Dn E``."""
        B, H, n, Dv = St.shape
        K = self.mix.shape[-1]
        BH = B * H
        if torch.is_grad_enabled():
            flat = lambda x: x.flatten(0, 1).unbind(1)  # noqa: E731  [B H, .] per chunk, one op each
        else:  # inference: each chunk's pieces contiguous (one copy each, not one per chunk and product)
            flat = lambda x: x.flatten(0, 1).transpose(0, 1).contiguous().unbind(0)  # noqa: E731
        St = St.flatten(0, 1)
        ys = []
        for Wn, Un, Dnn, Qn, Pn, mn in zip(flat(self.W), flat(self.U), flat(self.Dn), flat(self.Qs),
                                           flat(self.Pm), flat(self.mix)):
            En = torch.baddbmm(Un, Wn, St, beta=-1)  # the errors: [B H, C c, Dv]
            ys.append(torch.baddbmm(torch.bmm(Qn, St), Pn, En, alpha=-1))
            base = mn * St if K == 1 else torch.bmm(mn, St.reshape(BH, K, (n // K) * Dv)).view(BH, n, Dv)
            St = torch.baddbmm(base, Dnn, En)
        y = torch.stack(ys, dim=1).view(B, H, -1, Dv)[:, :, :self.tokens]
        return y, St.unflatten(0, (B, H))


def exact_pieces(rule, p, chunk_size: int, ext=None) -> ExactPieces:
    """`ExactPieces` of the call ``p`` (T > 0 tokens) in chunks of ``chunk_size`` tokens;
    ``ext``: the call's `extended_inputs` where the caller has them."""
    f = rule.form
    B, H, T = p.shape
    # a call shorter than a chunk is one short chunk, not a padded whole one (a prompt of a
    # few tokens at chunk size 1024 costs O(T^2), not O(C^2))
    C, c = max(1, min(chunk_size, T)), f.window
    mom = f.momentum
    xk, xv, xg = ext if ext is not None else rule.extended_inputs(p)
    N = -(-T // C)
    pad = N * C - T  # whole chunks: a padded token has k = 0, v = 0, theta = 0, alpha = eta = 1
    last = C - 1 - pad  # the last chunk's last real token: the final state is taken there
    lag = rule.bias.lag_weights(p.v.dtype, p.v.device)
    theta = F.pad(p.gates[f.gate("step_size")], (0, pad)).unflatten(-1, (N, C))  # [B, H, N, C]
    Q = pad_tokens(p.psi, pad).unflatten(2, (N, C))  # [B, H, N, C, Dk]
    gates = [p.alpha] + ([p.gates[f.gate("momentum")]] if mom else [])
    gates = F.pad(torch.stack(gates), (0, pad), value=1.0).unflatten(-1, (N, C))
    after = f.read == "after"

    # -- everything that does not depend on the memory, for all chunks at once --------------
    D = decay_matrix(gates)  # L (and E): [.., B, H, N, C, C]
    A = drop_negligible(torch.cumprod(gates[0], dim=-1))  # A_t: [B, H, N, C]
    L = D[0]
    if mom:
        E = D[1]
        Pe = drop_negligible(torch.cumprod(gates[1], dim=-1))
        K = drop_negligible(L @ E)  # M_t's coefficient of the write of token j
        PL = drop_negligible((L @ Pe.unsqueeze(-1)).squeeze(-1))  # M_t's coefficient of Z0
        PLp = shift_down(PL, 0.0, dim=-1)
    else:
        K = L
    Kp = shift_down(K, 0.0, dim=-2)  # K[t-1, j]: strictly lower
    Ap = shift_down(A, 1.0, dim=-1)
    Kr, Ar = (K, A) if after else (Kp, Ap)
    if f.gradient_at == "retained":
        # (gd, c = 1) the error at the decayed memory alpha_t M_{t-1} = A_t S - sum_{j<t}
        # L[t, j] theta_j e_j k_j^T: the system's rows are L's strictly lower part and A_t
        # in place of L[t-1, .] and A_{t-1}; the reads and the state update are unchanged
        Kp = K.tril(-1)
        Ap = A
    if c == 1:
        w = theta * F.pad(xg, (0, pad)).unflatten(-1, (N, C)) * lag[0]  # [B, H, N, C]
        X = pad_tokens(xk, pad).unflatten(2, (N, C))  # the write keys: [B, H, N, C, Dk]
        V = pad_tokens(xv, pad).unflatten(2, (N, C))
        XwT = (w.unsqueeze(-1) * X).transpose(-1, -2)  # (diag(w) X)^T: [B, H, N, Dk, C]
        Nm = Kp * (X @ XwT)  # strictly lower: the system is (I + Nm) E = ...
        Pm = Kr * (Q @ XwT)  # the reads' weights of the errors: [B, H, N, C, C]
    else:
        X, V, w, Nm, Pm = window_pieces(xk, xv, xg, lag, theta, Q, Kp, Kr, N, C, c, pad)
        w = w.flatten(-2)  # [B, H, N, C c]
    # per-row coefficients of X (and Q) side by side: [S | Z0]-shaped operands in one product
    if mom:
        Wx = _outer(torch.stack([_slots(Ap, c), -_slots(PLp, c)], dim=-1), X)  # [A' X | -PL' X]
        Dn = torch.stack([-_slots(chunk_ends(K, last), c) * w, _slots(chunk_ends(E, last), c) * w], dim=-2)
        Dn = (Dn.unsqueeze(-2) * X.transpose(-1, -2).unsqueeze(-3)).flatten(-3, -2)  # [D_S | D_Z]^T
        Qs = _outer(torch.stack([Ar, -(PL if after else PLp)], dim=-1), Q)  # [A Q | -PL Q]
    else:
        Wx = _slots(Ap, c).unsqueeze(-1) * X
        Dn = (-_slots(chunk_ends(K, last), c) * w).unsqueeze(-2) * X.transpose(-1, -2)  # D_S^T: [.., Dk, C c]
        Qs = Ar.unsqueeze(-1) * Q
    if mom:  # [S ; Z]_next = [[A_C, -PL_C], [0, P_C]] [S ; Z] + ...
        AC = chunk_ends(A, last)
        mix = torch.stack([AC, -chunk_ends(PL, last), torch.zeros_like(AC), chunk_ends(Pe, last)], dim=-1)
        mix = mix.unflatten(-1, (2, 2))
    else:
        mix = chunk_ends(A, last)[..., None, None]
    # the UT transform of every chunk at once: W = (I + Nm)^-1 [A' X | -PL' X], U = (I + Nm)^-1 V
    W, U = unit_lower_solve(Nm, Wx, V)
    W = drop_negligible(W)  # rows whose A' was dropped get it back from the solve's products
    return ExactPieces(W=W, U=U, Dn=Dn, Qs=Qs, Pm=Pm, mix=mix, tokens=T)


def window_pieces(xk, xv, xg, lag, theta, Q, Kp, Kr, N, C, c, pad):
    """The write keys, values and weights of an Omega window of c > 1 tokens, one row per
    (token j, slot s) — ``X [B, H, N, C c, Dk]``, ``V``, ``w [B, H, N, C, c]`` — and the
    system and read matrices ``Nm [.., C c, C c]``, ``Pm [.., C, C c]``. The Gram matrices
    are taken once over the chunk's C + c - 1 distinct keys and gathered by unfold."""
    B, H = theta.shape[:2]
    m = C + c - 1
    xk, xv, xg = F.pad(xk, (0, 0, 0, pad)), F.pad(xv, (0, 0, 0, pad)), F.pad(xg, (0, pad))
    # slot s of token t holds extended position t + s (the oldest first)
    w = theta.unsqueeze(-1) * xg.unfold(2, c, 1).unflatten(2, (N, C)) * lag.flip(0)  # [B, H, N, C, c]
    X = xk.unfold(2, c, 1).transpose(-1, -2).reshape(B, H, N, C * c, -1)
    V = xv.unfold(2, c, 1).transpose(-1, -2).reshape(B, H, N, C * c, -1)
    Kw = xk.unfold(2, m, C).transpose(-1, -2)  # each chunk's keys with its window: [B, H, N, m, Dk]
    G = (Kw @ Kw.transpose(-1, -2)).unfold(3, c, 1).unfold(4, c, 1)  # G[j, i, s, r] = x_{j,s} . x_{i,r}
    KW = Kp.unsqueeze(-1) * w.unsqueeze(-3)  # K'[j, i] w[i, r]: [B, H, N, C, C, c]
    Nm = (G * KW.unsqueeze(-2)).permute(0, 1, 2, 3, 5, 4, 6).reshape(B, H, N, C * c, C * c)
    QK = (Q @ Kw.transpose(-1, -2)).unfold(-1, c, 1)  # q_t . x_{j,s}: [B, H, N, C, C, c]
    Pm = (QK * (Kr.unsqueeze(-1) * w.unsqueeze(-3))).flatten(-2)  # [B, H, N, C, C c]
    return X, V, w, Nm, Pm
