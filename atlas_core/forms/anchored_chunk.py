"""The chunk computations of anchored rules, ``core:chunkwise``'s forms (docs/math.md, "Parallel
forms"; the strategy, its chunk grid and the scan over chunks are `atlas_core.strategies.chunkwise`).

Every gradient of a chunk is taken at the block's anchor memory; retention and momentum are linear
recurrences solved with decay matrices (`decay.decay_matrix`); reads are exact. Per chunk:

- the linear memory with gd or momentum (``"linear_chunk"``) runs in `linear_scan` (its chunk
  step `linear_scan.chunk_step`); its algebra: with U the bias's error derivatives at the anchor
  and Phi the (window-extended) keys,
  ``M_t = A_t M_0 - P^L_t Z_0 - sum_l K[t, l] u_l phi_l^T``, so
  ``y_t = A_t M_0 psi_t - P^L_t Z_0 psi_t - sum_l K[t, l] (phi_l . psi_t) u_l``: a C x (C + c - 1)
  masked "attention" matrix times U; no d x d tensor per token. K is ``L diag(theta) Wm`` for gd
  and ``L E diag(theta) Wm`` for momentum (L, E the retention and momentum decay matrices, Wm the
  banded Omega-window matrix, `window_matrix`), formed for all chunks at once by `chunk_kernels`;
- `key_linear_chunk`: the same with a per-key retain factor (GLA; gd, window 1), the scalar
  ``L[t, l]`` replaced by ``exp(b_t - b_l)`` of log-decay segment sums (docs/math.md, "Exact
  chunked forms" (e));
- `dual_chunk` (``"dual_chunk"``: rank-one per-token gradients, e.g. ``titans:mlp``): the linear
  form once per layer, each token read at its own weights without forming them;
- `generic_chunk` (``"generic_chunk"``: any other structure or algorithm with a chunk form, Muon):
  per-token anchored gradients, the algorithm's own recurrence and per-token reads, an O(C |W|)
  transient per chunk;
- `stepped_chunk` (``"stepped_chunk"``: a nonlinear retention, Moneta's lq and Memora's KL): the
  anchored gradients of the chunk at once, then the algorithm's step with the retention's
  ``pre`` / ``post`` token by token, and per-token reads.

Which form a rule has is decided once by `atlas_core.forms.catalogue` (``rule.form.chunk_forms``).

Tensors: ``W {name: [B, H, *s]}``, chunk inputs ``xe, ve: [B, H, n + c - 1, .]`` (the c - 1 carried
window positions first), ``psi: [B, H, n, Dphi]``, errors ``U: [B, H, n + c - 1, Dv]``.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from ..knobs.algorithm import broadcast_gate
from .decay import decay_matrix, drop_negligible, log_tiny
from .key_decay_chunk import decayed_scores


def window_matrix(gamma_ext: torch.Tensor, lag: torch.Tensor, n: int) -> torch.Tensor:
    """Banded Omega-window weights ``[B, H, n, n + c - 1]`` for the n chunk tokens.

    ``gamma_ext: [B, H, n + c - 1]`` (the c - 1 carried tokens first), ``lag: [c]`` (index 0 =
    the current token). Row t covers extended positions t .. t + c - 1."""
    c = lag.shape[0]
    m = n + c - 1
    t_idx = torch.arange(n, device=lag.device).unsqueeze(1) + (c - 1)
    l_idx = torch.arange(m, device=lag.device).unsqueeze(0)
    dist = t_idx - l_idx  # how far back token l is from token t
    inside = (dist >= 0) & (dist < c)
    band = torch.where(inside, lag[dist.clamp(0, c - 1)], lag.new_zeros(()))  # [n, m]
    return band * gamma_ext.unsqueeze(-2)


def window_chunks(x: torch.Tensor, C: int, c: int, T: int) -> tuple[torch.Tensor, ...]:
    """The chunks of a window-extended sequence ``x: [B, H, T + c - 1, ...]``: chunk i covers
    extended positions ``iC .. min(iC + C, T) + c - 2`` (its c - 1 predecessors, then its tokens),
    each ``[B, H, n_i + c - 1, ...]``. One split (c = 1) or one unfold (overlapping, c > 1)."""
    if c == 1 or T == 0:
        return x.split(C, dim=2)
    N = -(-T // C)
    pad = N * C + c - 1 - x.shape[2]  # the last chunk may be short: pad, then cut it back
    if pad:
        x = torch.cat([x, x.new_zeros(*x.shape[:2], pad, *x.shape[3:])], dim=2)
    win = x.unfold(2, C + c - 1, C)  # [B, H, N, ..., C + c - 1]
    if win.dim() > 4:
        win = win.movedim(-1, 3)  # [B, H, N, C + c - 1, d]
    chunks = list(win.unbind(2))
    last = T - (N - 1) * C
    if last < C:
        chunks[-1] = chunks[-1].narrow(2, 0, last + c - 1)
    return tuple(chunks)


def _step_through(rule, W, opt, G, alpha, gates):
    """Per-token weights ``{k: [B, H, n, *s]}`` of a chunk from anchored gradients G, by the
    algorithm's `step` (the recurrence of the reference loop), and the final optimiser state.
    Tokens are taken apart with unbind (one backward op), not by indexing in the loop."""
    n = alpha.shape[-1]
    g_t = {k: g.unbind(2) for k, g in G.items()}
    gate_t = {k: x.unbind(2) for k, x in gates.items()}
    alpha_t = alpha.unbind(2)
    steps = []
    for t in range(n):
        W, opt = rule.algorithm.step(
            W, opt, {k: g[t] for k, g in g_t.items()}, alpha=alpha_t[t],
            gates={k: x[t] for k, x in gate_t.items()}, retention=rule.retention,
        )
        steps.append(W)
    return {k: torch.stack([w[k] for w in steps], dim=2) for k in W}, opt


def _bmm_add(acc: torch.Tensor, a: torch.Tensor, b: torch.Tensor, alpha: float = 1.0) -> torch.Tensor:
    """``acc + alpha * a @ b`` for ``[B, H, ., .]`` tensors, as one fused `baddbmm`."""
    B, H = acc.shape[:2]
    out = torch.baddbmm(acc.reshape(B * H, *acc.shape[2:]), a.reshape(B * H, *a.shape[2:]),
                        b.reshape(B * H, *b.shape[2:]), alpha=alpha)
    return out.view(acc.shape)


def _shift_rows(x: torch.Tensor, first: torch.Tensor) -> torch.Tensor:
    """Rows for M_{t-1}: drop the last row, put ``first`` (M_{-1}'s row) on top (dim 2)."""
    return torch.cat([first, x[:, :, :-1]], dim=2)


def chunk_stack(x: torch.Tensor, C: int, N: int, value: float) -> torch.Tensor:
    """``x: [B, H, T]`` padded with ``value`` to N whole chunks: ``[B, H, N, C]``."""
    return F.pad(x, (0, N * C - x.shape[-1]), value=value).unflatten(-1, (N, C))


def _shift_down(x: torch.Tensor, first: float) -> torch.Tensor:
    """Rows for M_{t-1} of a kernel ``[..., n, m]``: row t takes row t - 1, row 0 is ``first``."""
    return torch.cat([torch.full_like(x[..., :1, :], first), x[..., :-1, :]], dim=-2)


def chunk_kernels(rule, p, xg, lag, C: int, c: int, T: int, gd_form: bool) -> dict:
    """Everything of each chunk that does not depend on the memory, for all chunks in one batched
    pass (causal, so a padded last chunk is exact once cut back to its n tokens). Per chunk i,
    ``kern[name][i]``:

    - ``L [n, n]`` retention decay matrix, ``A [n]`` its running product, ``Wm [n, m]`` the
      Omega-window weights (m = n + c - 1; not formed for the gd paths when c = 1);
    - with ``gd_form`` (gd / momentum: the linear and dual paths): ``K [n, m]`` (the update of M_t
      by each token's error), ``Kr, Ar [n, 1]`` the rows the reads use (shifted to M_{t-1} for
      ``read = "before"``) and, for momentum, ``KZ [n, m]`` (of Z_t), ``PL, PLr [n, 1]`` (Z_0's
      coefficient in M_t) and ``Pn [1, 1]`` (Z_0's in the final Z).
    """
    N = -(-T // C)
    if N == 0:
        return {}
    alpha = chunk_stack(p.alpha, C, N, 1.0)  # [B, H, N, C]
    L = decay_matrix(alpha)
    A = drop_negligible(torch.cumprod(alpha, dim=-1))
    kern = {"L": L, "A": A}
    if not (gd_form and c == 1):  # a one-token window is a diagonal: not formed on the gd paths
        g_ext = torch.stack(window_chunks(F.pad(xg, (0, N * C - T)), C, c, N * C), dim=2)
        kern["Wm"] = window_matrix(g_ext, lag, C)  # [B, H, N, C, C + c - 1]
    f = rule.form
    if gd_form:
        theta = chunk_stack(p.gates[f.gate("step_size")], C, N, 0.0)
        if c == 1:  # theta diag(Wm) scales the columns: no C x C product
            scale = (theta * chunk_stack(xg, C, N, 0.0) * lag[0]).unsqueeze(-2)
        else:
            TW = theta.unsqueeze(-1) * kern["Wm"]
        if f.update == "gd":
            K = L * scale if c == 1 else L @ TW
        else:
            eta = chunk_stack(p.gates[f.gate("momentum")], C, N, 1.0)
            E = decay_matrix(eta)
            KZ = E * scale if c == 1 else E @ TW  # Z_t's coefficients
            K = drop_negligible(L @ KZ)
            P = drop_negligible(torch.cumprod(eta, dim=-1))
            PL = drop_negligible(L @ P.unsqueeze(-1))  # [B, H, N, C, 1]
            kern.update(KZ=KZ, PL=PL, Pn=P[..., -1, None, None])
            kern["PLr"] = _shift_down(PL, 0.0) if f.read == "before" else PL
        kern["K"] = K
        Ar = A.unsqueeze(-1)
        kern["Kr"] = _shift_down(K, 0.0) if f.read == "before" else K
        kern["Ar"] = _shift_down(Ar, 1.0) if f.read == "before" else Ar
    out = {}
    last = T - (N - 1) * C  # tokens in the last chunk
    for name, x in kern.items():
        chunks = list(x.unbind(2))
        if last < C:  # cut the padded chunk back: rows to `last`, the token columns likewise
            cut = chunks[-1]
            for d in range(3, x.dim()):
                if x.shape[d] > 1:
                    cut = cut.narrow(d - 1, 0, x.shape[d] - (C - last))
            chunks[-1] = cut
        out[name] = chunks
    return out


def dual_chunk(rule, W, opt, xe, ve, kern, psi, anchor):
    """gd / momentum on a structure with rank-one per-token gradients (`grad_factors`) whose
    read is a chain of matrix products (`apply_layers`), e.g. ``titans:mlp``: the dual form.

    Each weight after token t is ``W_t = A_t W_0 - PL_t Z_0 - sum_l K[t, l] delta_l z_l^T``,
    so a layer applied to token t's input r_t is
    ``A_t W_0 r_t - PL_t Z_0 r_t - sum_l K[t, l] (z_l . r_t) delta_l``: the linear path's
    masked product, once per layer. No per-token weights are formed: O(C^2 + C d) per layer
    instead of O(C |W|). Products and their sums are fused (`baddbmm`) and per-token scalings
    go on the smaller operand: on a CPU every pass over a weight-sized tensor costs about as
    much as a small matrix product."""
    S = rule.structure
    # {k: (delta [B, H, m, out], z [B, H, m, in])}, the errors taken at the anchor's forward
    fac = S.grad_factors(anchor, xe, lambda pred: rule.bias.error(pred, ve))
    A, K, Kr, Ar = kern["A"], kern["K"], kern["Kr"], kern["Ar"]
    PL, PLr = kern.get("PL"), kern.get("PLr")
    Z0 = {k: opt[f"Z.{k}"] for k in W} if PL is not None else None

    def layer(name, r):  # r: [B, H, n, in] (token t's input to this layer, at its own weights)
        delta, z = fac[name]
        Wk = W[name].transpose(-1, -2)
        if r.shape[-1] <= Wk.shape[-1]:  # scale the smaller side: r [n, in] or the output [n, out]
            out = (Ar * r) @ Wk
            if Z0 is not None:
                out = _bmm_add(out, -PLr * r, Z0[name].transpose(-1, -2))
        else:
            out = Ar * (r @ Wk)
            if Z0 is not None:
                out = torch.addcmul(out, PLr, r @ Z0[name].transpose(-1, -2), value=-1.0)
        return _bmm_add(out, Kr * (r @ z.transpose(-1, -2)), delta, alpha=-1.0)

    def outer(coef, delta, z):  # sum_l coef_l delta_l z_l^T: [B, H, out, in], scaling the smaller
        if delta.shape[-1] <= z.shape[-1]:
            return (coef * delta).transpose(-1, -2), z
        return delta.transpose(-1, -2), coef * z

    y = S.apply_layers(psi, layer)
    An, Kn = A[:, :, -1, None, None], K[:, :, -1, :, None]
    new = {}
    for k, (delta, z) in fac.items():
        base = An * W[k] if Z0 is None else torch.addcmul(An * W[k], PL[:, :, -1, :, None], Z0[k], value=-1.0)
        new[k] = _bmm_add(base, *outer(Kn, delta, z), alpha=-1.0)
    if Z0 is not None:
        Pn, KZn = kern["Pn"], kern["KZ"][:, :, -1, :, None]
        opt = {f"Z.{k}": _bmm_add(Pn * Z0[k], *outer(KZn, delta, z)) for k, (delta, z) in fac.items()}
    return y, new, opt

def _anchored_grads(rule, xe, U, Wm, anchor) -> dict:
    """Per-token (window-weighted) gradients ``{k: [B, H, n, *s]}`` of a chunk, every one at the
    anchor memory: ``G_t = sum_l Wm[t, l] grad(anchor; phi_l, u_l)``."""
    per_tok = rule.structure.grad_per_token(anchor, xe, U)  # {k: [B, H, m, *s]}
    if rule.form.window == 1:  # Wm is diagonal (gamma_t lag[0]): a scaling, not a C x C product
        w = torch.diagonal(Wm, dim1=-2, dim2=-1)  # [B, H, n]
        return {k: broadcast_gate(w, g) * g for k, g in per_tok.items()}
    return {k: torch.einsum("bhtl,bhl...->bht...", Wm, g) for k, g in per_tok.items()}


def generic_chunk(rule, W, opt, xe, U, Wm, L, A, gates, psi, alpha, anchor):
    S = rule.structure
    f = rule.form
    if f.rank_one_grads and f.algorithm_factors:
        # the gradients as rank-one factors (`Muon.chunk_factors`): no per-token gradient
        Wall, opt = rule.algorithm.chunk_factors(W, opt, S.grad_factors(anchor, xe, U), Wm,
                                                 decay=L, decay_from_start=A, gates=gates)
        return read_chunk(rule, W, Wall, psi), {k: w[:, :, -1] for k, w in Wall.items()}, opt
    G = _anchored_grads(rule, xe, U, Wm, anchor)
    if f.update is not None:
        # The algorithm's own step, token by token over the anchored gradients: O(C |W|)
        # work where the decay-matrix form (`Algorithm.chunk`) costs O(C^2 |W|) — what
        # dominates for a deep memory, whose |W| is far larger than C.
        Wall, opt = _step_through(rule, W, opt, G, alpha, gates)
    else:
        Wall, opt = rule.algorithm.chunk(W, opt, G, decay=L, decay_from_start=A, gates=gates)
    return read_chunk(rule, W, Wall, psi), {k: w[:, :, -1] for k, w in Wall.items()}, opt


def stepped_chunk(rule, W, opt, xe, U, Wm, gates, psi, alpha, anchor):
    """A nonlinear retention (``"stepped_chunk"``: Moneta's lq, Memora's KL): every gradient of
    the chunk is taken at the anchor memory, so all of them are formed at once
    (`_anchored_grads`); then the algorithm's step runs token by token, each applying the
    retention's ``pre`` / ``post`` to the memory between them (`_step_through`, the recurrence of
    the reference loop; state-sized elementwise work a token), and the reads are taken at the
    per-token weights. Exact for a chunk inside one anchor block: the reference loop computes
    the same gradients at the same anchor and applies the same steps in the same order."""
    G = _anchored_grads(rule, xe, U, Wm, anchor)
    Wall, opt = _step_through(rule, W, opt, G, alpha, gates)
    return read_chunk(rule, W, Wall, psi), {k: w[:, :, -1] for k, w in Wall.items()}, opt


def read_chunk(rule, W, Wall, psi):
    """Per-token reads at the per-token weights ``Wall`` (at ``M_{t-1}`` for read before)."""
    if rule.form.read == "before":
        Wall = {k: _shift_rows(w, W[k].unsqueeze(2)) for k, w in Wall.items()}
    return rule.structure.read_per_token(Wall, psi)


def key_linear_chunk(rule, M0, x, U, psi, alpha, w):
    """The linear path with a per-key retain factor (gd, one-token window; docs/math.md,
    "Per-key decay"): ``alpha: [B, H, n, Dk]``, the anchored errors ``U: [B, H, n, Dv]``, token
    weights ``w: [B, H, n]``. With ``b_t = sum_{m<=t} log alpha_m`` (from the chunk's start)
    ``M_t = M_0 Diag(exp(b_t)) - sum_{l<=t} w_l u_l (x_l * exp(b_t - b_l))^T``; the scores are
    formed from segment sums of log-gates only (`key_decay_chunk.decayed_scores`)."""
    b = log_tiny(alpha).cumsum(-2)  # [B, H, n, Dk]; finite gradient at alpha = 0
    xw = w.unsqueeze(-1) * x
    after = rule.form.read == "after"
    r = b if after else torch.cat([torch.zeros_like(b[..., :1, :]), b[..., :-1, :]], dim=-2)
    y = (psi * torch.exp(r)) @ M0.transpose(-1, -2) - decayed_scores(psi, r, xw, b, strict=not after) @ U
    bC = b[..., -1:, :]
    M = M0 * torch.exp(bC) - U.transpose(-1, -2) @ (xw * torch.exp(bC - b))
    return y, {"M": M}
