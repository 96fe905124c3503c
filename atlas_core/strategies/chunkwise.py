"""``core:chunkwise``: chunk-parallel form of anchored rules (Titans Sec 3.2, MIRAS Eq 28, Atlas Eq 15).

A rule with ``anchor = A`` takes every gradient inside a block of A tokens at the memory before
the block (docs/math.md, "Anchoring as part of the rule"). This strategy splits time into chunks of
C tokens that lie inside those blocks (C divides A; both grids aligned to absolute positions, so a
call that starts inside a chunk first runs up to the next chunk boundary): the gradients of a
chunk are all taken at the block's anchor memory, and everything after that is exact — a linear
retention and momentum are linear recurrences solved with decay matrices
(`atlas_core.forms.decay.decay_matrix`); a nonlinear retention (Moneta's lq, Memora's KL) is
applied step by step between the gradients formed at once (the ``stepped_chunk`` form); reads are
exact. So the result equals ``core:sequential`` on the same rule, for every accepted C and any
split of a sequence into calls.

Accepted: ``anchor % C == 0`` (C = 1 always; the default C is the largest divisor of the anchor up
to 64), and any C for a linear memory with a prediction-free bias (``core:dot``: its gradients do
not depend on the memory, so anchoring changes nothing). A per-token rule (``anchor = 1``) with a
memory-dependent bias is refused for C > 1: its exact chunked form is ``core:exact_chunk``.

The chunk computations are in `atlas_core.forms.linear_scan` (the linear memory with gd or
momentum: the memory-independent kernels of all chunks at once, then a loop that runs only the
recurrence, with its backward pass written out), `atlas_core.forms.anchored_chunk` (per-key
decay, the dual form of a rank-one structure, the generic per-token path of any other algorithm
with a chunk form, the stepped path of a nonlinear retention) and `atlas_core.forms.dot_chunk`;
what the strategy accepts is the chunk-form catalogue's answer
(`atlas_core.forms.catalogue.chunkwise_reason`), and which form runs is read from the rule's form
(``rule.form.chunk_forms``).

Training memory (`recompute`, docs/math.md "Training memory of the chunked strategies"): the
chunks form a scan whose carry is the state at a chunk boundary. With ``checkpoint`` (default: on
for the per-token path) each chunk is recomputed in the backward pass from its boundary state, so
only the boundary states stay saved; when those would exceed ``memory_budget_mib`` they are kept
only every ceil(sqrt(N)) chunks and each segment is recomputed in turn. Identical results.
"""

from __future__ import annotations

from dataclasses import replace

import torch
from pydantic import Field
from ..params import size_field

from ..forms import dot_chunk, recompute
from ..forms.catalogue import MAX_DEFAULT_CHUNK, chunkwise_reason, largest_divisor
from ..forms.anchored_chunk import (chunk_kernels, dual_chunk, generic_chunk, key_linear_chunk,
                                    stepped_chunk, window_chunks)
from ..forms.linear_scan import linear_scan
from ..forms.key_decay_chunk import run_key_decay
from ..host.registry import Params
from .base import Strategy


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
        return largest_divisor(A, MAX_DEFAULT_CHUNK)

    def supports(self, rule) -> tuple[bool, str]:
        f = rule.form  # decided once when the rule was built (atlas_core.forms.RuleForm)
        if not f.composed:
            return False, "core:chunkwise runs knob-composed rules; this rule is standalone"
        why = chunkwise_reason(f, self.chunk_size)  # an anchored form and the chunk grid
        return why is None, why or ""

    def fast_path(self, rule) -> bool:
        """The linear path (`linear_scan`): gd or momentum on a linear memory."""
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
            return run_key_decay(rule, p, C)
        if dot_chunk.applies(rule):  # the memory never enters: every chunk at once
            y, W = dot_chunk.run_dot(rule, p, C)
            return y, rule.final_state(W, {}, *rule.extended_inputs(p))
        fast = self.fast_path(rule)
        if fast and not per_key:
            return self.run_linear(rule, p, C)
        W = {k: p.state[k] for k in S.weight_shapes()}
        opt = {k: p.state[k] for k in rule.algorithm.init_opt(W)}
        xk, xv, xg = rule.extended_inputs(p)
        lag = rule.bias.lag_weights(p.v.dtype, p.v.device)
        dual = not fast and self.dual_path(rule)
        stepped = "stepped_chunk" in f.chunk_forms  # a nonlinear retention, stepped per token
        # Per-chunk pieces are cut by one op per tensor (split / unfold / unbind), not by slicing
        # inside the loop: the backward of a slice writes a zero gradient as long as the whole
        # sequence, so T / C slices would cost O(T^2 / C); these ops' backward is one op each.
        psi_c = p.psi.split(C, dim=2)
        alpha_c = p.alpha.split(C, dim=2)
        gates_c = {k: g.split(C, dim=2) for k, g in p.gates.items()}
        xk_c, xv_c = (window_chunks(x, C, c, T) for x in (xk, xv))
        kern = {} if per_key else chunk_kernels(rule, p, xg, lag, C, c, T, gd_form=fast or dual)
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
                y, W, opt = dual_chunk(rule, W, opt, xe, ve, k_i, psi, anchor)
            else:
                U = rule.bias.error(S.read(anchor, xe), ve)  # anchored error derivatives [B, H, m, Dv]
                if per_key:
                    y, W = key_linear_chunk(rule, W["M"], xe, U, psi, inp["alpha"], inp["w"])
                elif stepped:
                    gates = {name[2:]: x for name, x in inp.items() if name.startswith("g.")}
                    y, W, opt = stepped_chunk(rule, W, opt, xe, U, k_i["Wm"], gates, psi,
                                              inp["alpha"], anchor)
                else:
                    gates = {name[2:]: x for name, x in inp.items() if name.startswith("g.")}
                    y, W, opt = generic_chunk(rule, W, opt, xe, U, k_i["Wm"], k_i["L"],
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
        return y, rule.final_state(W, opt, xk, xv, xg, anchored)

    def run_linear(self, rule, p, C: int):
        """The linear path (`linear_scan`: gd or momentum on a linear memory); a last chunk
        shorter than C runs as a call of its own after the whole ones."""
        B, H, T = p.shape
        whole = T - T % C
        if 0 < whole < T:
            first, rest = p.split(whole)
            y1, st = self.run_linear(rule, first, C)
            y2, st = self.run_linear(rule, replace(rest, state=st), T - whole)
            return torch.cat([y1, y2], dim=2), st
        f = rule.form
        W = {k: p.state[k] for k in rule.structure.weight_shapes()}
        opt = {k: p.state[k] for k in rule.algorithm.init_opt(W)}
        xk, xv, xg = rule.extended_inputs(p)
        lag = rule.bias.lag_weights(p.v.dtype, p.v.device)
        A = f.anchor
        pos = rule.position(p) if A > 1 else 0
        anchor0 = rule.anchor_weights(p, W)["M"] if pos else None
        if T == 0:
            y = p.v.new_zeros(B, H, 0, rule.structure.d_out)
            anchored = rule.anchor_state(p, W, W) if A > 1 else None
            return y, rule.final_state(W, opt, xk, xv, xg, anchored)
        carry_bytes = recompute.carry_bytes({**W, **opt})
        segment = recompute.segment_size(T // C, carry_bytes, self.memory_budget_mib)
        per_chunk = self.recompute_chunks(rule, generic=False)
        scan = None  # the fused scan keeps one boundary state per chunk
        if per_chunk or segment > 1:
            def scan(body, carry, inputs):
                return recompute.scan(body, carry, inputs, per_chunk=per_chunk, segment=segment,
                                      params=list(rule.parameters()))

        y, M, Z, anchor = linear_scan(rule, p, xk, xv, xg, lag, C, W["M"], opt.get("Z.M"),
                                      anchor0, pos, scan)
        W = {"M": M}
        opt = {"Z.M": Z} if Z is not None else {}
        anchored = rule.anchor_state(p, {"M": anchor} if anchor is not None else W, W) if A > 1 else None
        return y, rule.final_state(W, opt, xk, xv, xg, anchored)

    def recompute_chunks(self, rule, generic: bool) -> bool:
        """Whether each chunk is recomputed in the backward pass (`recompute.scan`): the
        ``checkpoint`` param, by default on where a chunk forms per-token weights (``generic``:
        Muon, a deep memory without the dual form), whose intermediates are O(C |W|) per chunk."""
        flag = self.params.checkpoint
        return generic if flag is None else bool(flag)

    @property
    def memory_budget_mib(self) -> float | None:
        return self.params.memory_budget_mib


def build(params, ctx) -> Chunkwise:
    return Chunkwise(params)
