"""The state map of a piece of a sequence, computed from the rule's chunk form (no probe runs).

Context parallelism's ``affine`` mode (`atlas_core.distributed.context`) carries a memory through
a piece of a slice (its chunks' maps applied to it) and a gradient back through it, with its
outputs' reads added, without running the rule: the piece's affine map from its initial memory
to its final memory, kept chunk by chunk. Write the K memory
tensors ``[B, H, Dv, Dk]`` of the state (``M``, ``Z.M``, ``anchor.M``, in the order of their
keys) stacked along the key axis and transposed: ``St = [M^T ; Z^T ; anchor.M^T]: [B, H, n, Dv]``
with ``n = K Dk``. The columns of ``St`` (one per value dimension) evolve independently under one
operator that depends on the keys, gates and positions only, so a chunk of C tokens maps

    St_out = T_c St_in + b_c,         y_t = Y_t St_in + (a term without the memory)

with ``T_c: [n, n]``, ``b_c: [n, Dv]`` (the values enter only here) and ``Y_c: [C, n]`` (the
reads). The piece's map is the product of its chunks' ``(T_c, b_c)`` (``S_out = S_in P^T +
C^T`` in the rows layout of `context._rows`, with ``P = T_{N-1} ... T_0``), applied chunk by
chunk. Three chunk forms give ``(T_c, b_c, Y_c)`` (docs/math.md, "Exact chunked forms"
and "Parallel forms"; docs/distributed.md):

- ``exact`` (``anchor = 1``: the delta rule, Gated DeltaNet's gradient at the decayed memory,
  Longhorn, Gated DeltaProduct's sub-steps (one position each), Titans' momentum, an Omega
  window, scalar decay): the UT / WY transform of ``core:exact_chunk``.
  With its per-chunk products ``W = (I + N)^-1 [A' X | -PL' X]``, ``U = (I + N)^-1 V``, the
  errors are ``E = W St - U``, the reads ``y = Qs St - Pm E`` and the next state
  ``St' = mix St + Dn E``, so ``T_c = mix (x) I + Dn W``, ``b_c = -Dn U``, ``Y_c = Qs - Pm W``.
- ``key`` (per-key decay, gd, the l2 error: KDA): ``core:exact_chunk``'s per-key form
  (`key_decay_chunk`), see `_key_run`.
- ``anchored`` (``anchor = A > 1``: every gradient of a block at the block's anchor memory ``a``;
  ``core:chunkwise``'s linear path, chunks of C | A tokens aligned to the blocks): with the
  chunk's decay kernels ``K`` (of M), ``KZ`` (of Z), the running products ``A``, ``PL``, ``P``
  and its (window-extended) keys X and values V,
  ``M' = A M - PL Z - a X^T D_K X + V^T D_K X``, ``Z' = P Z + a X^T D_KZ X - V^T D_KZ X``,
  ``a' = a``, and ``y_t = M Ar_t psi_t - Z PLr_t psi_t - sum_l Kr[t, l] (x_l . psi_t) (a x_l - v_l)``;
  a chunk that opens a block first sets ``a = M``, and a slice that ends on a block boundary
  leaves ``anchor.M = M``.

Representation and cost (n = K Dk, per chunk of C tokens, `MAP_CHUNK`): the chunks' pieces are
formed for all chunks at once (as the strategies do, without a graph), each chunk's map in its
structured form ``T_c = mix (x) I + Dn Wm`` (`_Run`; the anchored form's ``Dn Wm`` touches only
Dk columns). `SliceMap.apply` carries a memory (``Dv`` columns) through them chunk after chunk,
``2 r n Dv`` multiply-adds a chunk for ``Dn Wm`` of rank r; `SliceMap.read_grad` runs back,
``h = Y_i^T gy_i + T_i^T h`` chunk by chunk from a gradient at the memory after the piece (or
0), about 1.5 times that: the gradient of the piece's outputs and of its final memory with
respect to its initial memory, without a backward pass through the piece. The slice's map
itself, ``P`` (n x n), is formed only for a small state (``n < TREE_BELOW``, composed in a tree,
where N small steps would cost more in their overhead than in their arithmetic): composing it
chunk by chunk would cost ``2 C n (n + Dv)`` a chunk.
Both run with subnormal floats flushed to 0 (`flush_subnormals`).

Under ``core:exact_chunk`` a context-parallel rank forms the exact form's pieces once, with a
graph (`forms.exact_chunk.exact_pieces`): it runs its slice on them from its true initial memory
(`ExactPieces.loop`, the strategy's own chunk loop), and reads the maps of its own slice's
pieces from the same pieces (`chunk_maps`).

`analytic_form` says which form covers a rule (None: `context` probes the map with the rule).
"""

from __future__ import annotations

from contextlib import contextmanager
from dataclasses import dataclass, replace

import torch
import torch.nn.functional as F

from ..forms import exact_chunk as ex
from ..forms.catalogue import slice_map_form
from ..forms.anchored_chunk import window_matrix
from ..forms.decay import log_tiny
from ..forms.key_decay_chunk import decayed_scores
from ..forms.linear_scan import kernel_rows

#: tokens per chunk of the maps (the map is the rule's: any chunk size gives it): ``MAP_CHUNK``
#: while n = K Dk < 64, twice that from there (fewer, larger batched products against the
#: chunk's own pieces, about C^2 a token); with an Omega window of c tokens the exact
#: form's system is C c wide, so its chunks are ``2 C / c`` (at least 4); an anchored rule's are
#: the largest divisor of the anchor up to C
MAP_CHUNK = 32


@contextmanager
def flush_subnormals():
    """Float arithmetic on the CPU with subnormal numbers read and written as 0 (restored after).
    A slice's map multiplies many decays: its entries fall below float32's smallest normal
    number (1.2e-38) over a few thousand tokens, and products on such numbers run many times
    slower on a CPU. Entries that small do not change the map's float32 results (float64's
    subnormals are below 2.2e-308)."""
    was = bool((torch.tensor([1e-39], dtype=torch.float32) * 2.0).item() == 0.0)
    if not was:
        torch.set_flush_denormal(True)
    try:
        yield
    finally:
        if not was:
            torch.set_flush_denormal(False)


def _gate(rule, p, role: str) -> torch.Tensor:
    """The prepared gate with ``role`` (``"step_size"``, ``"momentum"``; `RuleForm.gate`)."""
    return p.gates[rule.form.gate(role)]


def analytic_form(rule) -> str | None:
    """``"exact"``, ``"key"`` or ``"anchored"`` when the slice map of ``rule`` has a chunk form
    here, else None: the catalogue's answer for the rule's form
    (`atlas_core.forms.catalogue.slice_map_form`): ``exact`` is the rules with the
    ``exact_chunk`` form, ``key`` those with ``key_decay_chunk`` and the l2 error, ``anchored``
    the anchored ones a linear kernel serves with the l2 error, one position a token."""
    return slice_map_form(rule.form)


@dataclass
class _Run:
    """Consecutive chunks of one length, batched, each map kept in its structured form
    ``T = Diag(diag) (mix (x) I_Dk) + [Dn; 0] [0 Wm 0]``: ``mix [B, H, N, K, K]``, ``diag
    [B, H, N, n]`` or None (ones), ``Dn [B, H, N, nd, r]`` (the first nd rows; the others have
    none), ``Wm [B, H, N, r, w]`` in the columns ``woff[i]`` to ``woff[i] + w`` of chunk i;
    ``b [B, H, N, nb, Dv]`` (the first nb <= n rows; the others are 0), ``Y [B, H, N, C, ny]``
    (the first ny <= n columns, the others 0; rows of padded tokens are ignored: their ``gy`` is
    0) and the number of real tokens."""

    mix: torch.Tensor
    diag: torch.Tensor | None
    Dn: torch.Tensor
    Wm: torch.Tensor
    woff: list[int]
    b: torch.Tensor
    Y: torch.Tensor
    tokens: int
    n: int = 0  # the state's width (0: Y's)

    @property
    def width(self) -> int:
        return self.n or self.Y.shape[-1]

    def dense(self) -> torch.Tensor:
        """Every chunk's ``T [B, H, N, n, n]``."""
        n, (nd, w) = self.width, (self.Dn.shape[-2], self.Wm.shape[-1])
        if nd == w == n:
            T = self.Dn @ self.Wm
        else:
            T = self.Dn.new_zeros(*self.Dn.shape[:3], n, n)
            for off in sorted(set(self.woff)):
                idx = [i for i, o in enumerate(self.woff) if o == off]
                T[:, :, idx, :nd, off:off + w] = self.Dn[:, :, idx] @ self.Wm[:, :, idx]
        K = self.mix.shape[-1]
        d = n // K
        for i in range(K):  # + Diag(diag) (mix (x) I), in place on the blocks' diagonals
            for j in range(K):
                add = self.mix[..., i, j, None]
                if self.diag is not None:
                    add = add * self.diag[..., i * d:(i + 1) * d]
                T[..., i * d:(i + 1) * d, j * d:(j + 1) * d].diagonal(dim1=-2, dim2=-1).add_(add)
        return T

    def step(self, x: torch.Tensor, i: int, out: torch.Tensor) -> torch.Tensor:
        """``T_i x`` for ``x [B, H, n, m]``, written into ``out`` (x's shape and layout, not x):
        the (mix (x) I) part in one batched product over the K blocks, then ``Dn (Wm x)`` added
        in place."""
        B, H, n, m = x.shape
        K = self.mix.shape[-1]
        if K == 1:  # a scalar a head
            torch.mul(x, self.mix[:, :, i], out=out)
        else:
            torch.bmm(self.mix[:, :, i].reshape(B * H, K, K), x.view(B * H, K, -1), out=out.view(B * H, K, -1))
        if self.diag is not None:
            out.mul_(self.diag[:, :, i].unsqueeze(-1))
        nd, off, w = self.Dn.shape[-2], self.woff[i], self.Wm.shape[-1]
        t = torch.bmm(self.Wm[:, :, i].flatten(0, 1), x[..., off:off + w, :].flatten(0, 1))
        out[..., :nd, :].flatten(0, 1).baddbmm_(self.Dn[:, :, i].flatten(0, 1), t)
        return out

    def step_t(self, h: torch.Tensor, i: int, out: torch.Tensor) -> torch.Tensor:
        """``T_i^T h`` for ``h [B, H, n, m]``, written into ``out`` (as `step`)."""
        B, H, n, m = h.shape
        K = self.mix.shape[-1]
        d = h if self.diag is None else self.diag[:, :, i].unsqueeze(-1) * h
        if K == 1:
            torch.mul(d, self.mix[:, :, i], out=out)
        else:
            torch.bmm(self.mix[:, :, i].mT.reshape(B * H, K, K), d.view(B * H, K, -1), out=out.view(B * H, K, -1))
        nd, off, w = self.Dn.shape[-2], self.woff[i], self.Wm.shape[-1]
        t = torch.bmm(self.Dn[:, :, i].mT.flatten(0, 1), h[..., :nd, :].flatten(0, 1))
        out[..., off:off + w, :].flatten(0, 1).baddbmm_(self.Wm[:, :, i].mT.flatten(0, 1), t)
        return out


def _minus_mm(a: torch.Tensor, m1: torch.Tensor, m2: torch.Tensor) -> torch.Tensor:
    """``a - m1 @ m2`` for ``[..., ., .]`` operands of one batch shape, in one batched call."""
    flat = lambda x: x.reshape(-1, *x.shape[-2:])  # noqa: E731
    return torch.baddbmm(flat(a), flat(m1), flat(m2), alpha=-1).view(a.shape)


#: below this state width n = K Dk a piece's chunk maps are composed in a tree (`SliceMap`)
TREE_BELOW = 64


class SliceMap:
    """A piece's chunk maps (`_Run`, consecutive) and the anchor reset after its last token
    (``reset = (ia, Dk)`` when it ends on a block boundary: the anchor block, rows ``ia`` on of
    ``St``, takes M's, the first Dk): `apply` carries a memory through them, `read_grad` a
    gradient back. With ``tree`` (small n: ``n < TREE_BELOW``, `slice_map`'s choice) the maps
    are formed and composed pairwise first (log2 N batched products, ``N n^3`` multiply-adds,
    the levels kept for `read_grad`), so carrying a memory is one product, not N small steps;
    else chunk after chunk (``2 r n Dv`` a chunk, no n x n matrix)."""

    def __init__(self, runs: list[_Run], reset: tuple[int, int] | None = None, tree: bool = False):
        self.runs, self.reset, self.tree = runs, reset, tree
        if tree:
            n = runs[0].width
            self.levels, P, c = [], None, None  # per run: the T of every level of its tree
            for run in runs:
                T, b = run.dense(), F.pad(run.b, (0, 0, 0, n - run.b.shape[-2]))
                lv = [T]
                while T.shape[2] > 1:
                    T, b = _pairs(T, b)
                    lv.append(T)
                self.levels.append(lv)
                P, c = (T[:, :, 0], b[:, :, 0]) if P is None else (T[:, :, 0] @ P, T[:, :, 0] @ c + b[:, :, 0])
            self.P, self.c = P, c  # St_out = P St_in + c, before the reset

    @torch.no_grad()
    @flush_subnormals()
    def apply(self, rows: torch.Tensor) -> torch.Tensor:
        """The memory after the slice from the memory ``rows`` before it (rows layout ``[B, H, Dv,
        n]``), chunk after chunk: ``St' = T_c St + b_c`` (``Dv`` columns, not the ``n + Dv`` of
        composing)."""
        x = rows.transpose(-1, -2).contiguous()
        if self.tree:
            x = torch.baddbmm(self.c.flatten(0, 1), self.P.flatten(0, 1), x.flatten(0, 1)).view(x.shape)
        spare = torch.empty_like(x)
        for run in self.runs if not self.tree else []:
            for i in range(run.Dn.shape[2]):
                x, spare = run.step(x, i, spare), x
                x[..., :run.b.shape[-2], :] += run.b[:, :, i]
        if self.reset is not None:
            ia, Dk = self.reset
            x[..., ia:, :] = x[..., :Dk, :]
        return x.transpose(-1, -2)

    @torch.no_grad()
    @flush_subnormals()
    def read_grad(self, gy: torch.Tensor, after: torch.Tensor | None = None) -> torch.Tensor:
        """``d <gy, y> / d S_in`` in the rows layout ``[B, H, Dv, n]``; ``gy: [B, H, T, Dv]``, one
        row per position (with sub-steps, `positions` spreads a token's over its sub-steps).
        ``after``: a gradient at the memory after the slice (rows layout), carried back with
        the reads' (``d <after, S_out> / d S_in`` added: one pass for both)."""
        hs, lo = [], 0
        for run in self.runs:  # h = Y^T gy per chunk
            N, C = run.Y.shape[2], run.Y.shape[3]
            g = F.pad(gy[:, :, lo:lo + run.tokens], (0, 0, 0, N * C - run.tokens)).unflatten(2, (N, C))
            lo += run.tokens
            hs.append(run.Y.transpose(-1, -2) @ g)  # [B, H, N, ny, Dv]
        if self.tree:
            return self._read_tree(hs, after)
        r0 = self.runs[0]
        first = after is None  # back through the chunks: h_i = Y_i^T g_i + T_i^T h_{i+1}
        if first:
            total = gy.new_zeros(*r0.b.shape[:2], r0.width, gy.shape[-1])
        else:
            total = after.transpose(-1, -2).contiguous()
            if self.reset is not None:  # the reset's transpose: the anchor block's gradient onto M's
                ia, Dk = self.reset
                total[..., :Dk, :] += total[..., ia:, :]
                total[..., ia:, :] = 0
        spare = torch.empty_like(total)
        for run, h in zip(reversed(self.runs), reversed(hs)):
            ny = h.shape[-2]
            for i in range(run.Dn.shape[2] - 1, -1, -1):
                if not first:  # (the last chunk's T^T of nothing is skipped)
                    total, spare = run.step_t(total, i, spare), total
                total[..., :ny, :] += h[:, :, i]
                first = False
        return total.transpose(-1, -2)

    def _read_tree(self, hs, after):
        """`read_grad` over the tree: ``h_pair = h_left + T_left^T h_right`` level by level, the
        runs joined in order, then ``P^T`` of the gradient after."""
        n = self.runs[0].width
        total, before = None, None  # before: the product of the earlier runs' maps
        for h, lv in zip(hs, self.levels):
            h = F.pad(h, (0, 0, 0, n - h.shape[-2]))
            for T in lv[:-1]:
                h = _pairs_back(T, h)
            h = h[:, :, 0]
            total = h if before is None else total + before.transpose(-1, -2) @ h
            T = lv[-1][:, :, 0]
            before = T if before is None else T @ before
        if after is not None:
            a = after.transpose(-1, -2).contiguous()
            if self.reset is not None:  # the reset's transpose: the anchor block's gradient onto M's
                ia, Dk = self.reset
                a[..., :Dk, :] += a[..., ia:, :]
                a[..., ia:, :] = 0
            total = torch.baddbmm(total.flatten(0, 1), self.P.transpose(-1, -2).flatten(0, 1),
                                  a.flatten(0, 1)).view(total.shape)
        return total.transpose(-1, -2)


def _pairs(T: torch.Tensor, b: torch.Tensor):
    """Compose neighbours (2i, 2i + 1) of a chunk sequence; an odd last one passes through."""
    N = T.shape[2]
    if N % 2:
        T = torch.cat([T, torch.eye(T.shape[-1], dtype=T.dtype, device=T.device).expand_as(T[:, :, :1])], 2)
        b = torch.cat([b, torch.zeros_like(b[:, :, :1])], dim=2)
    T0, T1 = T[:, :, 0::2], T[:, :, 1::2]
    return T1 @ T0, T1 @ b[:, :, 0::2] + b[:, :, 1::2]


def _pairs_back(T: torch.Tensor, h: torch.Tensor) -> torch.Tensor:
    """The reverse pass of `_pairs`: ``h_pair = h_left + T_left^T h_right``."""
    if h.shape[2] % 2:
        h = torch.cat([h, torch.zeros_like(h[:, :, :1])], dim=2)
    return h[:, :, 0::2] + T[:, :, 0::2].transpose(-1, -2) @ h[:, :, 1::2]


def positions(rule, gy: torch.Tensor) -> torch.Tensor:
    """``gy [B, T, H, Dv]`` (the rule's outputs' gradient) as ``[B, H, T n, Dv]`` over the n
    sub-steps of each token (``steps_per_token``): the token's gradient at its reading
    sub-step, 0 at the others (their reads are dropped)."""
    gy = gy.transpose(1, 2)
    n = rule.steps_per_token
    if n == 1:
        return gy
    out = gy.new_zeros(*gy.shape[:2], gy.shape[2] * n, gy.shape[3])
    out[:, :, rule.form.reading_substep::n] = gy
    return out


# -- the exact (UT / WY) form ------------------------------------------------------------------------
def chunk_maps(pieces: ex.ExactPieces, lo: int = 0, hi: int | None = None,
               tokens: int | None = None) -> _Run:
    """The maps of chunks ``lo`` to ``hi`` (exclusive; None: to the last) of
    `forms.exact_chunk.ExactPieces` in the structured form (`_Run`), without a graph:
    ``T_c = mix (x) I + Dn W``, ``b_c = -Dn U``, ``Y_c = Qs - Pm W``. ``tokens``: the real tokens
    of those chunks (None: every token of the pieces)."""
    part = lambda x: x.detach()[:, :, lo:hi]  # noqa: E731
    W, U, Dn, Qs, Pm = (part(x) for x in (pieces.W, pieces.U, pieces.Dn, pieces.Qs, pieces.Pm))
    return _Run(mix=part(pieces.mix), diag=None, Dn=Dn, Wm=W, woff=[0] * W.shape[2],
                b=torch.bmm(Dn.flatten(0, 2), U.flatten(0, 2)).neg_().view(*Dn.shape[:-1], U.shape[-1]),
                Y=_minus_mm(Qs, Pm, W), tokens=pieces.tokens if tokens is None else tokens)


def _exact_run(rule, p, C: int) -> _Run:
    """`_Run` of a per-token rule (``anchor = 1``) by `core:exact_chunk`'s UT transform."""
    return chunk_maps(ex.exact_pieces(rule, p, C))


# -- the per-key decay form ---------------------------------------------------------------------------
def _key_run(rule, p, C: int) -> _Run:
    """`_Run` of gd with a per-key retain factor and the l2 error (KDA; `key_decay_chunk`): with
    ``b`` the running log-decay per key, ``E = Wsol St - U``, ``y = Qr St - Pm E``,
    ``St' = exp(b_C) St - Dn E``, so ``T_c = Diag(exp(b_C)) - Dn Wsol``, ``b_c = Dn U``,
    ``Y_c = Qr - Pm Wsol``."""
    B, H, T = p.shape
    Dk = p.psi.shape[-1]
    C = max(1, min(C, T))
    N = -(-T // C)
    pad = N * C - T
    f = rule.form
    alpha = p.alpha if f.retention_shape == "key" else p.alpha.unsqueeze(-1).expand(B, H, T, Dk)
    b = F.pad(log_tiny(alpha), (0, 0, 0, pad)).unflatten(2, (N, C)).cumsum(-2)
    bp = torch.cat([torch.zeros_like(b[..., :1, :]), b[..., :-1, :]], dim=-2)
    lag0 = rule.bias.lag_weights(p.v.dtype, p.v.device)[0]
    w = F.pad(_gate(rule, p, "step_size") * p.gamma * lag0, (0, pad)).unflatten(-1, (N, C))
    X, V, Q = (F.pad(x, (0, 0, 0, pad)).unflatten(2, (N, C)) for x in (p.phik, p.v, p.psi))
    Xw = w.unsqueeze(-1) * X
    rq = b if f.read == "after" else bp
    Pm = decayed_scores(Q, rq, Xw, b, strict=f.read != "after")
    bC = b[..., -1:, :]
    Dn = (Xw * torch.exp(bC - b)).transpose(-1, -2)  # [B, H, N, Dk, C]
    rs = b if f.gradient_at == "retained" else bp
    Nm = decayed_scores(X, rs, Xw, b, strict=True)
    Wsol, U = ex.unit_lower_solve(Nm, X * torch.exp(rs), V)
    return _Run(mix=torch.ones_like(bC[..., :1]), diag=torch.exp(bC.squeeze(-2)), Dn=-Dn,
                Wm=Wsol, woff=[0] * N, b=Dn @ U, Y=_minus_mm(Q * torch.exp(rq), Pm, Wsol), tokens=T)


# -- the anchored form ---------------------------------------------------------------------------------
def _anchored_run(rule, p, C: int, opens: list[bool], nkeys: int) -> _Run:
    """`_Run` of an anchored rule over ``p``, which starts on a chunk boundary (chunk i opens an
    anchor block when ``opens[i]``). Memory blocks of ``St``: M, Z.M (momentum), anchor.M."""
    B, H, T = p.shape
    c = rule.form.window
    mom = rule.form.momentum
    Dk, Dv = p.psi.shape[-1], p.v.shape[-1]
    xk, xv, xg = rule.extended_inputs(p)
    N = -(-T // C)
    pad = N * C - T
    last = C - 1 - pad
    lag = rule.bias.lag_weights(p.v.dtype, p.v.device)
    chunked = lambda x, value: F.pad(x, (0, pad), value=value).unflatten(-1, (N, C))  # noqa: E731
    alpha = chunked(p.alpha, 1.0)
    A = torch.cumprod(alpha, dim=-1)
    theta = chunked(_gate(rule, p, "step_size"), 0.0)
    m = C + c - 1

    def ext(x):  # each chunk's extended positions: [B, H, N, C + c - 1, ...]
        x = F.pad(x, (0, 0) * (x.dim() - 3) + (0, pad))
        return x.unfold(2, m, C).movedim(-1, 3) if x.dim() == 4 else x.unfold(2, m, C)

    X, V = ext(xk).contiguous(), ext(xv)  # X: every chunk's Wm, read by the steps' products
    if c == 1:  # theta_t Wm_t: the token's own weight at its own position
        w, rows = theta * chunked(xg, 0.0) * lag[0], None
    else:
        w, rows = None, theta.unsqueeze(-1) * window_matrix(ext(xg), lag, C)  # [B, H, N, C, m]
    after = rule.form.read == "after"
    shift = lambda x, first: ex.shift_down(x, first, dim=-2)  # noqa: E731
    eta = chunked(_gate(rule, p, "momentum"), 1.0) if mom else None
    # the decay kernels by their row recurrences, as core:chunkwise's linear path forms them;
    # KZ's last row is its row at the last real token too (a padded token has eta = 1, theta = 0)
    Ks, KZn, Pe, PL = kernel_rows(alpha, eta, w, None if rows is None else rows.unbind(-2), m)
    K = torch.stack(Ks, dim=-2)  # [B, H, N, C, m]
    if mom:
        PL = PL.unsqueeze(-1)  # [.., C, 1]
        PLr = PL if after else shift(PL, 0.0)
    Kr = K if after else shift(K, 0.0)
    Ar = A.unsqueeze(-1) if after else shift(A.unsqueeze(-1), 1.0)
    kend = ex.chunk_ends(K, last)  # [B, H, N, m]
    n, K_ = nkeys * Dk, nkeys
    ia = (nkeys - 1) * Dk  # anchor.M's block
    # T = mix (x) I + [Dn; 0] [0 Wm]: Dn Wm holds -X^T D_K X (M's rows) and X^T D_KZ X (Z's) in
    # the anchor block's columns (Wm = X), or in M's when the chunk opens a block
    mix = X.new_zeros(B, H, N, K_, K_)
    mix[..., 0, 0] = ex.chunk_ends(A, last)
    mix[..., -1, -1] = 1.0
    Qc = ex.pad_tokens(p.psi, pad).unflatten(2, (N, C))
    scores = Kr * (Qc @ X.transpose(-1, -2))  # Kr[t, l] (x_l . psi_t): [B, H, N, C, m]
    # Dn = [-D_K X ; D_KZ X]^T, b = [X^T D_K V ; -X^T D_KZ V] (anchor.M's rows take no write),
    # Y = [Ar Q | -PLr Q | -scores X], each block written in place
    nd = ia
    Dn = X.new_empty(B, H, N, nd, m)
    torch.mul(X.transpose(-1, -2), kend.unsqueeze(-2), out=Dn[..., :Dk, :]).neg_()
    every = all(opens)  # every chunk reads at M (a = M): Y's anchor columns are 0, not kept
    Y = X.new_empty(B, H, N, C, ia if every else n)
    torch.mul(Ar, Qc, out=Y[..., :Dk])
    if mom:
        torch.mul(X.transpose(-1, -2), KZn.unsqueeze(-2), out=Dn[..., Dk:, :])
        mix[..., 0, 1] = -ex.chunk_ends(PL.squeeze(-1), last)
        mix[..., 1, 1] = ex.chunk_ends(Pe, last)
        torch.mul(PLr, Qc, out=Y[..., Dk:2 * Dk]).neg_()
    if every:
        Y[..., :Dk] -= scores @ X
    else:
        Y[..., ia:] = scores.neg_() @ X
    b = (Dn @ V).neg_()
    if every:  # a = M: the anchor block's part of the map moves onto M's
        mix[..., 0] += mix[..., -1]
        mix[..., -1] = 0
    elif any(opens):  # a chunk that opens a block takes a = M first (T J and Y J, J: a = M), i.e.
        # the anchor block's columns move onto M's and become 0
        op = torch.tensor(opens, dtype=X.dtype, device=X.device)[:, None, None]  # [N, 1, 1]
        Y[..., :Dk] += op * Y[..., ia:]
        Y[..., ia:] *= 1 - op
        mix[..., 0] += op[:, :, 0] * mix[..., -1]
        mix[..., -1] *= 1 - op[:, :, 0]
    return _Run(mix=mix, diag=None, Dn=Dn, Wm=X, woff=[0 if o else ia for o in opens], b=b, Y=Y,
                tokens=T, n=n)


# -- the entry point -----------------------------------------------------------------------------------
@torch.no_grad()
@flush_subnormals()
def slice_map(rule, p, memory_keys: list[str], chunk_size: int | None = None) -> SliceMap:
    """The chunk maps of the piece prepared in ``p`` (`ComposedRule.prepare`, with the piece's
    carried inputs in its state; the memory entries are not read). ``memory_keys``: the memory
    tensors in the order of `context._rows`."""
    kind = analytic_form(rule)
    if kind is None:
        raise ValueError("this rule's slice map has no chunk form here (analytic_form is None)")
    mom = rule.form.momentum
    if kind in ("exact", "key"):
        want = ["M", "Z.M"] if mom else ["M"]
    else:
        want = ["M", "Z.M", "anchor.M"] if mom else ["M", "anchor.M"]
    if list(memory_keys) != want:
        raise ValueError(f"memory keys {memory_keys} are not the {kind} form's {want}")
    T, Dk = p.shape[2], p.psi.shape[-1]
    if T == 0:  # an empty slice: the identity
        n = len(want) * Dk
        z = p.v.new_zeros(*p.shape[:2], 1, n, 1)
        return SliceMap([_Run(mix=torch.ones_like(z[..., :1, :]), diag=None, Dn=z, Wm=z.mT, woff=[0],
                              b=p.v.new_zeros(*p.shape[:2], 1, n, p.v.shape[-1]),
                              Y=p.v.new_zeros(*p.shape[:2], 1, 1, n), tokens=0)])
    n, Dv = len(want) * Dk, p.v.shape[-1]
    base = MAP_CHUNK if n < 64 else 2 * MAP_CHUNK
    if kind in ("key", "exact"):
        if kind == "key":
            run = _key_run(rule, p, chunk_size or base)
        else:
            c = rule.form.window
            run = _exact_run(rule, p, chunk_size or (base if c == 1 else max(4, 2 * base // c)))
        return SliceMap([run], tree=n < TREE_BELOW)
    A = rule.form.anchor
    C = chunk_size or max(d for d in range(1, min(A, base) + 1) if A % d == 0)
    if A % C:
        raise ValueError(f"chunk_size={C} must divide the anchor {A}")
    pos = rule.position(p)
    head = min((-pos) % C, T)
    runs, parts = [], []
    if head:
        first, rest = p.split(head)
        if rule.form.window > 1:  # the rest's carried window: the last c - 1 inputs after the head
            xk, xv, xg = rule.extended_inputs(first)
            c = rule.form.window
            rest = replace(rest, state={**rest.state, "window.k": xk[:, :, -(c - 1):],
                                        "window.v": xv[:, :, -(c - 1):],
                                        "window.gamma": xg[:, :, -(c - 1):]})
        parts.append((first, head, [pos % A == 0]))
    else:
        rest = p
    if rest.shape[2]:
        start = pos + head
        chunks = -(-rest.shape[2] // C)
        parts.append((rest, C, [(start + i * C) % A == 0 for i in range(chunks)]))
    for part, size, opens in parts:
        runs.append(_anchored_run(rule, part, size, opens, len(want)))
    reset = ((len(want) - 1) * Dk, Dk) if (pos + T) % A == 0 and T else None  # a = M after
    return SliceMap(runs, reset, tree=n < TREE_BELOW)
