"""``core:chunkwise``: chunk-parallel form of anchored rules (Titans Sec 3.2, MIRAS Eq 28, Atlas Eq 15).

A rule with ``anchor = A`` takes every gradient inside a block of A tokens at the memory before
the block (docs/math.md, "Anchoring as part of the rule"). This strategy splits time into chunks of
C tokens that lie inside those blocks (C divides A; both grids aligned to absolute positions, so a
call that starts inside a chunk first runs up to the next chunk boundary): the gradients of a
chunk are all taken at the block's anchor memory, and everything after that is exact — retention
and momentum are linear recurrences solved with decay matrices (`decay.decay_matrix`), reads are
exact. So the result equals ``core:sequential`` on the same rule, for every accepted C and any
split of a sequence into calls.

Accepted: ``anchor % C == 0`` (C = 1 always; the default C is the largest divisor of the anchor up
to 64), and any C for a linear memory with a prediction-free bias (``core:dot``: its gradients do
not depend on the memory, so anchoring changes nothing). A per-token rule (``anchor = 1``) with a
memory-dependent bias is refused for C > 1: its exact chunked form is ``core:exact_chunk``.

Two paths:
- **linear memory with gd or momentum** (docs/math.md, "Parallel forms"): with U the bias's error
  derivatives at the anchor and Phi the (window-extended) keys, the memory after token t is
  ``M_t = A_t M_0 - P^L_t Z_0 - sum_l K[t, l] u_l phi_l^T``, so
  ``y_t = A_t M_0 psi_t - P^L_t Z_0 psi_t - sum_l K[t, l] (phi_l . psi_t) u_l``:
  a C x (C + c - 1) masked "attention" matrix times U. No d x d tensor per token is formed;
  cost per chunk O(C^2 d + C d^2), memory O(T d + (T / C) d^2).
  K is ``L diag(theta) Wm`` for gd and ``L E diag(theta) Wm`` for momentum, where L and E are the
  retention and momentum decay matrices and Wm the banded Omega-window matrix
  (``Wm[t, l] = gamma_l * lag[t - l]`` for the c tokens ending at t; the identity when c = 1).
  A per-key retain factor (GLA; gd, window 1) replaces the scalar ``L[t, l]`` by the vector
  ``exp(b_t - b_l)`` of log-decay segment sums inside each score (`_key_linear_chunk`;
  docs/math.md, "Exact chunked forms" (e)).
- **any other structure / algorithm with a chunk form** (deep memory, Muon): per-token anchored
  gradients, the algorithm's `chunk` recurrence, and per-token reads — an O(C |W|) transient per
  chunk, never O(T |W|).

Training memory (`recompute`, docs/math.md "Training memory of the chunked strategies"): the
chunks form a scan whose carry is the state at a chunk boundary. With ``checkpoint`` (default: on
for the per-token path) each chunk is recomputed in the backward pass from its boundary state, so
only the boundary states stay saved; when those would exceed ``memory_budget_mib`` they are kept
only every ceil(sqrt(N)) chunks and each segment is recomputed in turn. Identical results.
"""

from __future__ import annotations

from dataclasses import replace

import torch
import torch.nn.functional as F
from pydantic import Field
from ..params import size_field

from ..host.registry import Params
from ..knobs.algorithm import Algorithm, _bc
from . import dot_chunk, recompute
from .base import Strategy
from .decay import decay_matrix, log_tiny


MAX_DEFAULT_CHUNK = 64
#: default `ChunkwiseParams.memory_budget_mib`: chunk-boundary states kept before segments are used
DEFAULT_BUDGET_MIB = 1024.0


class ChunkwiseParams(Params):
    chunk_size: int | None = size_field(None, "chunk", ge=1, description="tokens per chunk (C); must divide the rule's anchor; default: the "
        f"largest divisor of the anchor up to {MAX_DEFAULT_CHUNK}",
    )
    backend: str | None = Field(
        None, description="force a kernel backend by name, or 'torch' for the PyTorch code"
    )
    checkpoint: bool | None = Field(
        None, description="recompute each chunk in the backward pass from the state at its start "
        "instead of keeping its intermediates (identical results; one more forward per chunk); "
        "default: on where a chunk forms per-token weights (Muon, deep memory without the dual "
        "form), off elsewhere",
    )
    memory_budget_mib: float | None = Field(
        DEFAULT_BUDGET_MIB, gt=0, description="when the chunk-boundary states kept for the "
        "backward pass would exceed this many MiB, keep them only every ceil(sqrt(N)) chunks and "
        "recompute each segment in the backward pass (identical results; one more forward per "
        "chunk); null: keep every chunk boundary",
    )


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


def _window_chunks(x: torch.Tensor, C: int, c: int, T: int) -> tuple[torch.Tensor, ...]:
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


def _chunk_stack(x: torch.Tensor, C: int, N: int, value: float) -> torch.Tensor:
    """``x: [B, H, T]`` padded with ``value`` to N whole chunks: ``[B, H, N, C]``."""
    return F.pad(x, (0, N * C - x.shape[-1]), value=value).unflatten(-1, (N, C))


def _shift_down(x: torch.Tensor, first: float) -> torch.Tensor:
    """Rows for M_{t-1} of a kernel ``[..., n, m]``: row t takes row t - 1, row 0 is ``first``."""
    return torch.cat([torch.full_like(x[..., :1, :], first), x[..., :-1, :]], dim=-2)


def _chunk_kernels(rule, p, xg, lag, C: int, c: int, T: int, gd_form: bool) -> dict:
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
    alpha = _chunk_stack(p.alpha, C, N, 1.0)  # [B, H, N, C]
    L = decay_matrix(alpha)
    A = torch.cumprod(alpha, dim=-1)
    kern = {"L": L, "A": A}
    if not (gd_form and c == 1):  # a one-token window is a diagonal: not formed on the gd paths
        g_ext = torch.stack(_window_chunks(F.pad(xg, (0, N * C - T)), C, c, N * C), dim=2)
        kern["Wm"] = window_matrix(g_ext, lag, C)  # [B, H, N, C, C + c - 1]
    f = rule.form
    if gd_form:
        theta = _chunk_stack(p.gates[f.gate("step_size")], C, N, 0.0)
        if c == 1:  # theta diag(Wm) scales the columns: no C x C product
            scale = (theta * _chunk_stack(xg, C, N, 0.0) * lag[0]).unsqueeze(-2)
        else:
            TW = theta.unsqueeze(-1) * kern["Wm"]
        if f.update == "gd":
            K = L * scale if c == 1 else L @ TW
        else:
            eta = _chunk_stack(p.gates[f.gate("momentum")], C, N, 1.0)
            E = decay_matrix(eta)
            KZ = E * scale if c == 1 else E @ TW  # Z_t's coefficients
            K = L @ KZ
            P = torch.cumprod(eta, dim=-1)
            PL = L @ P.unsqueeze(-1)  # [B, H, N, C, 1]
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


class Chunkwise(Strategy):
    name = "core:chunkwise"
    uses_backends = True

    def __init__(self, params: ChunkwiseParams | None = None) -> None:
        self.params = params or ChunkwiseParams()
        self.chunk_size = self.params.chunk_size

    @property
    def requested_backend(self) -> str | None:
        return self.params.backend

    def describe(self) -> str:
        return f"{self.name}(chunk_size={self.chunk_size if self.chunk_size else 'auto'})"

    def chunk_for(self, rule) -> int:
        """The chunk size this strategy runs ``rule`` with (see `supports`)."""
        if self.chunk_size is not None:
            return self.chunk_size
        A = rule.form.anchor
        if A == 1:
            return MAX_DEFAULT_CHUNK if rule.form.anchor_free else 1
        return self.chunk_for_anchor(A)

    @staticmethod
    def chunk_for_anchor(A: int) -> int:
        """The largest divisor of ``A`` up to `MAX_DEFAULT_CHUNK`."""
        return max(d for d in range(1, min(A, MAX_DEFAULT_CHUNK) + 1) if A % d == 0)

    def supports(self, rule) -> tuple[bool, str]:
        f = rule.form  # decided once when the rule was built (atlas_core.forms.RuleForm)
        if not f.composed:
            return False, "core:chunkwise runs knob-composed rules; this rule is standalone"
        if f.per_token_transition:
            return False, (
                f"retention {f.name('retention')!r} multiplies the memory by a per-token "
                "matrix (a transition such as RWKV-7's diagonal-plus-low-rank one), which has no "
                "chunked form here; core:sequential runs it"
            )
        if not f.retention_linear:
            return False, (
                f"retention {f.name('retention')!r} is nonlinear (it transforms the memory "
                "after each step), so a chunk cannot be solved as a linear recurrence"
            )
        if f.retention_shape != "head" and not (
                self.fast_path(rule) and f.update == "gd" and not f.windowed):
            return False, (
                f"retention {f.name('retention')!r} retains per key dimension; the chunk "
                "form here decays per key only for core:gd on a linear memory with a one-token "
                "window (core:sequential runs the rest)"
            )
        if not f.algorithm_chunk:
            hint = f.chunk_hint
            return False, (
                f"algorithm {f.name('algorithm')!r} has no chunk form" + (f"; {hint}" if hint else "")
            )
        A, C = f.anchor, self.chunk_size
        free = A == 1 and f.anchor_free  # any chunk: the gradients ignore the memory
        if f.gradient_at != "current" and not free:
            return False, (
                f"retention {f.name('retention')!r} takes each gradient at that token's "
                "decayed memory, which no chunk anchor shares; core:exact_chunk runs it exactly "
                "where it can (gd, l2), else core:sequential"
            )
        if C is None and A == 1 and not free:
            return False, (
                "the rule is per-token (anchor = 1) and its gradients depend on the memory, so a "
                "chunk of it cannot be formed from one anchor; core:exact_chunk runs it exactly "
                "where it can, or set [memory] anchor = A for Titans' mini-batch rule"
            )
        if C is not None and C > 1 and A % C and not free:
            if A == 1:
                return False, (
                    f"chunk_size={C} would take every gradient of a chunk at the chunk's start, "
                    f"which is another rule than this per-token one (anchor = 1); to keep that "
                    f"function write anchor = {C} in [memory], or run the per-token rule with "
                    "core:exact_chunk or core:sequential"
                )
            return False, (
                f"chunk_size={C} does not divide the rule's anchor={A}: a chunk must lie inside "
                f"one anchor block; use a divisor of {A} (e.g. {self.chunk_for_anchor(A)})"
            )
        return True, ""

    def fast_path(self, rule) -> bool:
        """The linear path (`_linear_chunk`): gd or momentum on a linear memory."""
        return "linear_chunk" in rule.form.chunk_forms

    def dual_path(self, rule) -> bool:
        """The dual form (`_dual_chunk`): gd or momentum on a structure that gives its per-token
        gradients as rank-one factors and its read as a chain of matrix products."""
        return "dual_chunk" in rule.form.chunk_forms

    def run(self, rule, inputs):
        C = self.chunk_for(rule)
        T = inputs.shape[2]
        head = (-rule.position(inputs)) % C if rule.form.anchored else 0
        if 0 < head < T:  # the call starts inside a chunk: run up to its boundary first
            first, rest = inputs.split(head)
            y1, st = self.run(rule, first)
            y2, st = self.run(rule, replace(rest, state=st))
            return torch.cat([y1, y2], dim=2), st
        backend = self.bound_backends().select(self, rule, inputs)
        if backend is not None:
            return backend.run(self, rule, inputs)
        return self.run_torch(rule, inputs)

    # -- PyTorch --------------------------------------------------------------------------------
    def run_torch(self, rule, p):
        B, H, T = p.shape
        f = rule.form
        S, c, A = rule.structure, f.window, f.anchor
        # a call aligned to a chunk boundary (see `run`); a short call is one short chunk, not a
        # padded whole one
        C = max(1, min(self.chunk_for(rule), T))
        per_key = f.retention_shape == "key"  # decay per key dimension (gd, c = 1)
        if per_key and A == 1 and f.error == "dot":
            # per-key decay with the dot bias (GLA): its gradients ignore the memory, so the
            # anchored form is the exact one, run for all chunks at once
            from .key_decay_chunk import run_key_decay

            return run_key_decay(rule, p, C)
        if dot_chunk.applies(rule):  # the memory never enters: every chunk at once
            y, W = dot_chunk.run_dot(rule, p, C)
            return y, rule._final_state(W, {}, *rule._extended(p))
        W = {k: p.state[k] for k in S.weight_shapes()}
        opt = {k: p.state[k] for k in rule.algorithm.init_opt(W)}
        xk, xv, xg = rule._extended(p)
        lag = rule.bias.lag_weights(p.v.dtype, p.v.device)
        fast = self.fast_path(rule)
        dual = not fast and self.dual_path(rule)
        # Per-chunk pieces are cut by one op per tensor (split / unfold / unbind), not by slicing
        # inside the loop: the backward of a slice writes a zero gradient as long as the whole
        # sequence, so T / C slices would cost O(T^2 / C); these ops' backward is one op each.
        psi_c = p.psi.split(C, dim=2)
        alpha_c = p.alpha.split(C, dim=2)
        gates_c = {k: g.split(C, dim=2) for k, g in p.gates.items()}
        xk_c, xv_c = (_window_chunks(x, C, c, T) for x in (xk, xv))
        kern = {} if per_key else _chunk_kernels(rule, p, xg, lag, C, c, T, gd_form=fast or dual)
        if per_key:
            w_c = (p.gates[f.gate("step_size")] * xg * lag[0]).split(C, dim=2)  # token weights [B, H, n]
        pos = rule.position(p) if A > 1 else 0
        carry = {f"W.{k}": w for k, w in W.items()} | {f"opt.{k}": z for k, z in opt.items()}
        if A > 1:  # the anchor memory is carried while a block spans chunks
            carry |= {f"anchor.{k}": w for k, w in rule.anchor_weights(p, W).items()}
        N = -(-T // C)  # no chunk at all when T = 0
        inputs = []
        for i in range(N):
            inp = {"xe": xk_c[i], "ve": xv_c[i], "psi": psi_c[i]}  # xe, ve: [B, H, n + c - 1, .]
            inp |= {f"k.{name}": x[i] for name, x in kern.items()}
            if per_key:
                inp |= {"alpha": alpha_c[i], "w": w_c[i]}
            elif not (fast or dual):
                inp |= {"alpha": alpha_c[i]} | {f"g.{k}": g[i] for k, g in gates_c.items()}
            inputs.append(inp)

        def body(i, carry, inp):
            W = {k[2:]: x for k, x in carry.items() if k.startswith("W.")}
            opt = {k[4:]: x for k, x in carry.items() if k.startswith("opt.")}
            if A > 1 and (pos + i * C) % A:  # inside a block: the carried anchor
                anchor = {k[7:]: x for k, x in carry.items() if k.startswith("anchor.")}
            else:  # a chunk that opens an anchor block
                anchor = W
            xe, ve, psi = inp["xe"], inp["ve"], inp["psi"]
            k_i = {name[2:]: x for name, x in inp.items() if name.startswith("k.")}
            if dual:  # the anchored errors come out of the structure's own forward
                y, W, opt = self._dual_chunk(rule, W, opt, xe, ve, k_i, psi, anchor)
            else:
                U = rule.bias.error(S.read(anchor, xe), ve)  # anchored error derivatives [B, H, m, Dv]
                if per_key:
                    y, W = _key_linear_chunk(rule, W["M"], xe, U, psi, inp["alpha"], inp["w"])
                elif fast:
                    y, W, opt = self._linear_chunk(rule, W, opt, xe, U, k_i, psi)
                else:
                    gates = {name[2:]: x for name, x in inp.items() if name.startswith("g.")}
                    y, W, opt = self._generic_chunk(rule, W, opt, xe, U, k_i["Wm"], k_i["L"],
                                                    k_i["A"], gates, psi, inp["alpha"], anchor)
            out = {f"W.{k}": w for k, w in W.items()} | {f"opt.{k}": z for k, z in opt.items()}
            if A > 1 and (i + 1 == N or (pos + (i + 1) * C) % A):  # read by the next chunk or
                out |= {f"anchor.{k}": w for k, w in anchor.items()}  # the final state only
            return y, out

        per_chunk = self.recompute_chunks(rule, generic=not (fast or dual or per_key))
        segment = recompute.segment_size(N, recompute.carry_bytes(carry), self.memory_budget_mib)
        ys, carry = recompute.scan(body, carry, inputs, per_chunk=per_chunk, segment=segment,
                                   params=list(rule.parameters()))
        W = {k[2:]: x for k, x in carry.items() if k.startswith("W.")}
        opt = {k[4:]: x for k, x in carry.items() if k.startswith("opt.")}
        anchor = {k[7:]: x for k, x in carry.items() if k.startswith("anchor.")}
        y = torch.cat(ys, dim=2) if ys else p.v.new_zeros(B, H, 0, S.d_out)
        anchored = rule.anchor_state(p, anchor, W) if A > 1 else None
        return y, rule._final_state(W, opt, xk, xv, xg, anchored)

    def recompute_chunks(self, rule, generic: bool) -> bool:
        """Whether each chunk is recomputed in the backward pass (`recompute.scan`): the
        ``checkpoint`` param, by default on where a chunk forms per-token weights (``generic``:
        Muon, a deep memory without the dual form), whose intermediates are O(C |W|) per chunk."""
        flag = self.params.checkpoint
        return generic if flag is None else bool(flag)

    @property
    def memory_budget_mib(self) -> float | None:
        return self.params.memory_budget_mib

    def _linear_chunk(self, rule, W, opt, xe, U, kern, psi):
        M0 = W["M"]  # (B, H, Dv, Dphi)
        A, K = kern["A"], kern["K"]
        scores = psi @ xe.transpose(-1, -2)  # (phi_l . psi_t): [B, H, n, m]
        y = kern["Ar"] * (psi @ M0.transpose(-1, -2)) - (kern["Kr"] * scores) @ U
        M = A[:, :, -1, None, None] * M0 - torch.einsum("bhl,bhlv,bhlp->bhvp", K[:, :, -1], U, xe)
        if "PL" in kern:
            Z0 = opt["Z.M"]
            y = y - kern["PLr"] * (psi @ Z0.transpose(-1, -2))
            M = M - kern["PL"][:, :, -1, :, None] * Z0
            Z = kern["Pn"] * Z0 + torch.einsum("bhl,bhlv,bhlp->bhvp", kern["KZ"][:, :, -1], U, xe)
            opt = {"Z.M": Z}
        return y, {"M": M}, opt

    def _dual_chunk(self, rule, W, opt, xe, ve, kern, psi, anchor):
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

    def _generic_chunk(self, rule, W, opt, xe, U, Wm, L, A, gates, psi, alpha, anchor):
        S = rule.structure
        f = rule.form
        if f.rank_one_grads and f.algorithm_factors:
            # the gradients as rank-one factors (`Muon.chunk_factors`): no per-token gradient
            Wall, opt = rule.algorithm.chunk_factors(W, opt, S.grad_factors(anchor, xe, U), Wm,
                                                     decay=L, decay_from_start=A, gates=gates)
            return self._read_chunk(rule, W, Wall, psi), {k: w[:, :, -1] for k, w in Wall.items()}, opt
        per_tok = S.grad_per_token(anchor, xe, U)  # {k: [B, H, m, *s]}, at the anchor memory
        if f.window == 1:  # Wm is diagonal (gamma_t lag[0]): a scaling, not a C x C product
            w = torch.diagonal(Wm, dim1=-2, dim2=-1)  # [B, H, n]
            G = {k: _bc(w, g) * g for k, g in per_tok.items()}
        else:
            G = {k: torch.einsum("bhtl,bhl...->bht...", Wm, g) for k, g in per_tok.items()}
        if f.update is not None:
            # The algorithm's own step, token by token over the anchored gradients: O(C |W|)
            # work where the decay-matrix form (`Algorithm.chunk`) costs O(C^2 |W|) — what
            # dominates for a deep memory, whose |W| is far larger than C.
            Wall, opt = _step_through(rule, W, opt, G, alpha, gates)
        else:
            Wall, opt = rule.algorithm.chunk(W, opt, G, decay=L, decay_from_start=A, gates=gates)
        return self._read_chunk(rule, W, Wall, psi), {k: w[:, :, -1] for k, w in Wall.items()}, opt

    @staticmethod
    def _read_chunk(rule, W, Wall, psi):
        """Per-token reads at the per-token weights ``Wall`` (at ``M_{t-1}`` for read before)."""
        if rule.form.read == "before":
            Wall = {k: _shift_rows(w, W[k].unsqueeze(2)) for k, w in Wall.items()}
        return rule.structure.read_per_token(Wall, psi)


def _key_linear_chunk(rule, M0, x, U, psi, alpha, w):
    """The linear path with a per-key retain factor (gd, one-token window; docs/math.md,
    "Per-key decay"): ``alpha: [B, H, n, Dk]``, the anchored errors ``U: [B, H, n, Dv]``, token
    weights ``w: [B, H, n]``. With ``b_t = sum_{m<=t} log alpha_m`` (from the chunk's start)
    ``M_t = M_0 Diag(exp(b_t)) - sum_{l<=t} w_l u_l (x_l * exp(b_t - b_l))^T``; the scores are
    formed from segment sums of log-gates only (`key_decay_chunk.decayed_scores`)."""
    from .key_decay_chunk import decayed_scores

    b = log_tiny(alpha).cumsum(-2)  # [B, H, n, Dk]; finite gradient at alpha = 0
    xw = w.unsqueeze(-1) * x
    after = rule.form.read == "after"
    r = b if after else torch.cat([torch.zeros_like(b[..., :1, :]), b[..., :-1, :]], dim=-2)
    y = (psi * torch.exp(r)) @ M0.transpose(-1, -2) - decayed_scores(psi, r, xw, b, strict=not after) @ U
    bC = b[..., -1:, :]
    M = M0 * torch.exp(bC) - U.transpose(-1, -2) @ (xw * torch.exp(bC - b))
    return y, {"M": M}


def build(params, ctx) -> Chunkwise:
    return Chunkwise(params)
