"""Context parallelism: one long sequence split along time over R ranks, each holding its slice.

``y_r, state_r = context_parallel(rule, q_r, k_r, v_r, gates_r, state=s0, group=group)`` runs
rank r's slice (``[B, T_r, H, D]``, the r-th consecutive piece of the sequence) and returns its
outputs and the state after its slice (on the last rank, the state after the whole sequence): the
same numbers as one call of ``rule`` on the whole sequence (docs/math.md: any split of a sequence
into calls equals one call, the state carrying what is needed). ``s0``, the state before the first
token, is read on rank 0 (None: the rule's initial state); its gradient comes back on rank 0.
Gradients flow to every rank's inputs and to the rule's parameters (each rank holds the
contribution of its slice; sum them over the group as data parallelism does).

Two ways, chosen by the rule (`mode_for`):

``affine`` (the memory update is affine in the memory: ``core:linear`` memory with the ``core:l2``
bias, alone or inside a window bias, ``core:gd`` or ``core:momentum``, ``core:none`` or
``core:decay`` retention, any anchor; e.g. the delta rule, ``titans:titans``, ``omega:omeganet``):

1. the state splits into *carried inputs*, fixed by the data and the position alone (a window
   bias's last c - 1 inputs, ``window.*``; the anchor block position ``anchor.pos``), and the
   *memory* (``M``, the optimiser state ``Z.M``, the anchor memory ``anchor.M``). Rank r's carried
   inputs are the last c - 1 inputs of rank r - 1's slice (one all-gather; slices must hold at
   least c - 1 tokens) and the position ``(pos0 + T_0 + ... + T_{r-1}) mod A``;
2. with its carried inputs fixed, a piece of a slice maps its initial memory affinely to its
   final memory. Every memory tensor is ``[B, H, Dv, Dphi]`` and the rows of the stacked memory
   ``S [B, H, Dv, K * Dphi]`` (K tensors) evolve independently under one shared operator, so
   ``S_out = S_in P^T + C`` with ``P: [B, H, K Dphi, K Dphi]`` and ``C: [B, H, Dv, K Dphi]``.
   Where the rule has a chunk form (`state_map.analytic_form`: the per-token delta family by the
   UT / WY transform, per-key decay (KDA) by its per-key form, anchored rules by the anchored
   chunk form; Gated DeltaNet, Titans, Omega windows, scalar decays), the map is kept as its
   chunks' maps (`state_map.slice_map`), not composed into ``P`` (except in a tree for a small
   state, n < 64): a memory is carried through them (`SliceMap.apply`, Dv columns) and a
   gradient back (`SliceMap.read_grad`). Otherwise
   (momentum with a per-key decay) ``(P, C)`` are measured with the rule itself, exactly: one
   run from S = 0 gives C, and ``m = ceil(K Dphi / Dv)`` runs from basis rows (row i of probe p
   holds basis vector ``p Dv + i``) give the columns of P, one after another, without a graph
   (`_probe`);
3. the map work: rank 0 needs no map (its initial memory is ``s0``) and the last rank's is
   applied by no rank, so only the middle slices 1 .. R - 2 have maps, and `map_plan` cuts them,
   end to end, into R consecutive pieces of about equal length, piece j's maps formed by rank j
   (a piece inside rank j's own slice under ``core:exact_chunk`` is read from the chunk pieces of
   its own run, `forms.exact_chunk.exact_pieces` / `state_map.chunk_maps`; another rank's
   tokens are sent to it, with the carried inputs at the piece's start). Probed maps stay with
   their slice's rank (their ``g`` below needs its graph);
4. forward, a chain of boundary memories (`map_plan.Chain`): rank 0 runs its slice (with a graph) and
   hands on its final memory ``S_1``; each piece's rank carries the memory at its start through
   the piece's maps and hands on the memory at its end; rank r > 0 runs its slice (with a
   graph) from the memory at its start. Point-to-point messages, one ``[B, H, Dv, K Dphi]``
   memory per piece boundary;
5. backward, the same chain the other way: the last rank runs its backward of the slice with
   its final memory's gradient ``gS`` (the caller's) and hands on the gradient at its initial
   memory; each piece's rank carries the gradient at its end back through its maps, adding the
   gradient of the piece's outputs in the same pass (`SliceMap.read_grad`; the outputs'
   gradients come from their rank; a probed piece adds its slice's ``g`` from its graph and
   multiplies by P), plus ``gS`` of a slice that ends there, and hands it on; rank r < R - 1
   runs its backward of the slice with the gradient at its final memory. The gradient of each
   rank's carried window inputs goes back to the rank whose inputs they are (one all-gather).

Cost of ``affine`` per rank, slice of T_r tokens, with a chunk form: one forward and one backward
of the slice (what one process running the slice does), plus ``(R - 2) / R`` of a slice's maps
(R = 4: half a slice's): their pieces (about a forward's work without a graph, shared with the
slice's own run under ``core:exact_chunk`` where the piece is the rank's own), carrying a memory
through them (``2 r (K Dphi) Dv`` multiply-adds a chunk of C tokens for a map ``mix (x) I +
Dn Wm`` of rank r; r = C for the exact form, Dphi for the anchored one) and a gradient back with
the reads (about 1.5 times that). Composing the maps into P would cost ``2 r (K Dphi) (K Dphi +
Dv)`` a chunk and ``R (K Dphi)^2`` numbers sent per rank; the chain sends ``Dv K Dphi`` numbers
per boundary each way instead, and waits: a piece's memory goes on when its start's has come,
so the forward's chain takes the pieces' carries one after another (R - 2 slices' worth of
``Dv``-column carries, small against a slice's forward at R = 4) and likewise backward. With
probing, a middle rank's slice runs m + 2 times forward and twice backward (with Dv = Dphi,
m = K). Memory: the pieces' chunk maps (``T_r K Dphi`` numbers and the pieces, per rank).

``relay`` (any other rule: a deep memory such as ``titans:titans_deep``, Muon, a non-l2 bias;
`atlas_core.distributed.relay`):
rank r waits for rank r - 1's final state (point-to-point send/recv), runs its slice and sends its
final state on; the backward relays the state gradient from the last rank back. Exact for every
rule; the ranks run one after another (R slices in sequence: no speed-up, only the memory of one
slice per rank), and each boundary sends the whole state forward and its gradient back.
"""

from __future__ import annotations

import math
from typing import Any, Mapping

import torch
import torch.distributed as dist

from .. import input_checks
from ..forms import catalogue
from ..forms.exact_chunk import ExactPieces, exact_pieces
from ..strategies.exact_chunk import ExactChunk
from .call import Call, add_grads, grads, leaf
from .map_plan import Boundaries, Chain, exchange, map_plan
from . import state_map
from .state_map import SliceMap, analytic_form, chunk_maps, flush_subnormals, positions, slice_map

ANCHOR_POS = "anchor.pos"
CARRIED = ("window.k", "window.v", "window.gamma", ANCHOR_POS)
MODES = ("auto", "affine", "relay")


def affine_reason(rule) -> str | None:
    """None when ``rule``'s memory update is affine in its memory (the ``affine`` mode is exact),
    else why not (the knob that makes it non-affine): the catalogue's answer for the rule's form
    (`atlas_core.forms.catalogue.affine_reason`)."""
    return catalogue.affine_reason(rule.form)


def mode_for(rule, mode: str = "auto") -> str:
    """The mode ``context_parallel`` uses for ``rule`` (``auto``: affine when exact, else relay)."""
    if mode not in MODES:
        raise ValueError(f"mode {mode!r} is not a context-parallel mode; use one of {', '.join(MODES)}")
    why = affine_reason(rule)
    if mode == "affine" and why is not None:
        raise ValueError(f"mode 'affine' needs a memory update affine in the memory; this rule has {why}; "
                         "use mode 'relay' (or 'auto')")
    if mode == "auto":
        return "affine" if why is None else "relay"
    return mode


def _gather(t: torch.Tensor, call: Call) -> list[torch.Tensor]:
    out = [torch.empty_like(t) for _ in range(call.world)]
    dist.all_gather(out, t.contiguous(), group=call.group)
    return out


def _rows(state: Mapping[str, torch.Tensor], keys: list[str]) -> torch.Tensor:
    """The memory tensors ``[B, H, Dv, Dphi]`` side by side: ``[B, H, Dv, K * Dphi]``."""
    return torch.cat([state[k] for k in keys], dim=-1)


def _unrows(rows: torch.Tensor, keys: list[str]) -> dict[str, torch.Tensor]:
    return dict(zip(keys, rows.chunk(len(keys), dim=-1)))


def _carried_inputs(call: Call, s0, q, k, v, gates, lengths: list[int]) -> dict[str, torch.Tensor]:
    """Rank r's carried inputs: the window of rank r - 1's last inputs and the anchor position."""
    rule, r = call.rule, call.rank
    out: dict[str, torch.Tensor] = {}
    c = rule.window if rule.composed else 1
    if c > 1:
        short = [i for i, n in enumerate(lengths[:-1]) if n < c - 1]
        if short:
            raise ValueError(
                f"context parallelism with a {c}-token window needs every slice but the last to "
                f"hold at least {c - 1} tokens; rank {short[0]} holds {lengths[short[0]]}: use fewer "
                "ranks or a longer sequence")
        n = min(c - 1, q.shape[1])
        tail = {key: x[:, -n:] for key, x in (("q", q), ("k", k), ("v", v))}
        tail_gates = {g: x[:, -n:] for g, x in gates.items()}
        with torch.no_grad():  # the window after the last n tokens: the slice's own last inputs
            _, st = call.run(tail["q"], tail["k"], tail["v"], tail_gates, None)
        mine = torch.cat([st[w].reshape(st[w].shape[0], -1) for w in CARRIED[:3]], dim=-1)
        every = _gather(mine, call)
        if r == 0:
            for w in CARRIED[:3]:
                out[w] = s0[w]
        else:
            sizes = [s0[w][0].numel() for w in CARRIED[:3]]
            for w, part in zip(CARRIED[:3], every[r - 1].split(sizes, dim=-1)):
                out[w] = part.reshape(s0[w].shape).to(s0[w].dtype)
    if ANCHOR_POS in s0:
        A = rule.anchor
        pos0 = s0[ANCHOR_POS]
        out[ANCHOR_POS] = torch.remainder(pos0 + sum(lengths[:r]), A)
    return out


def _probe(call: Call, q, k, v, gates, carried, like: torch.Tensor):
    """``(P, C)`` of this rank's slice: ``S_out = S_in P^T + C`` (see the module docstring).
    The m + 1 probe runs go one after another, without a graph: the memory of one run."""
    keys = call.memory_keys
    B, H, Dv, KD = like.shape
    m = math.ceil(KD / Dv)

    def final_rows(rows_in: torch.Tensor) -> torch.Tensor:
        state = dict(carried)
        state.update(_unrows(rows_in, keys))
        with torch.no_grad():
            _, out = call.run(q, k, v, gates, state)
        return _rows(out, keys)

    C = final_rows(torch.zeros_like(like))
    P = torch.zeros(B, H, KD, KD, dtype=like.dtype, device=like.device)
    eye = torch.eye(KD, dtype=like.dtype, device=like.device)
    for p in range(m):
        lo, hi = p * Dv, min((p + 1) * Dv, KD)
        basis = torch.zeros_like(like)
        basis[:, :, :hi - lo] = eye[lo:hi]  # row i holds basis vector p*Dv + i
        cols = final_rows(basis) - C  # row i: P applied to that basis vector
        P[..., :, lo:hi] = cols[:, :, :hi - lo].transpose(-1, -2)
    return P, C


def _exact_chunk(call: Call, q: torch.Tensor) -> int | None:
    """The chunk size when this rank runs its slice from `forms.exact_chunk.ExactPieces` (the pieces
    formed once for both the map and the run): the strategy is ``core:exact_chunk`` on a rule of
    the exact form (`state_map.analytic_form`), the slice holds more than one token, autocast is
    off and the opt-in input checks are off (else the rule's own call runs the slice). None
    otherwise."""
    rule = call.rule
    if analytic_form(rule) != "exact" or q.shape[1] < 2 or rule.form.retention_shape == "key":
        return None
    strat = rule.runner(call.strategy)
    if not isinstance(strat, ExactChunk):
        return None
    if torch.is_autocast_enabled(q.device.type) or input_checks.wanted(None):
        return None
    return strat.chunk_for(rule)


def _run_pieces(call: Call, p, pieces: ExactPieces, rows_in: torch.Tensor):
    """The slice from the memory ``rows_in`` on the exact form's pieces, as the rule's call
    returns it: ``(y [B, T, H, Dv], final state)``."""
    rule = call.rule
    y, St = pieces.loop(rows_in.transpose(-1, -2))
    memory = {key: x.contiguous() for key, x in _unrows(St.transpose(-1, -2), call.memory_keys).items()}
    return rule.finish(p, (y, rule.final_state(memory, {}, *rule.extended_inputs(p))))


def _quantum(call: Call) -> int:
    """Where pieces of a slice may start (`map_plan`): on the chunks of ``core:exact_chunk`` when
    it runs a rule of the exact form (its rank reads its pieces' maps from its run's chunks), else
    anywhere."""
    if analytic_form(call.rule) != "exact":
        return 1
    strat = call.rule.runner(call.strategy)
    if not isinstance(strat, ExactChunk):
        return 1
    chunk, sub = strat.chunk_for(call.rule), call.rule.steps_per_token  # chunks of sub-step positions
    return chunk // math.gcd(chunk, sub)


def _window_at(call: Call, carried, xs, gs, start: int, like: torch.Tensor) -> dict:
    """The carried inputs at token ``start`` of this rank's slice: a window's last c - 1 inputs
    before it and the anchor position there."""
    rule = call.rule
    c = rule.window if rule.composed else 1
    out = {}
    if c > 1:
        if start == 0:
            out.update({w: carried[w] for w in CARRIED[:3]})
        else:  # the window after the last c - 1 tokens before start (from the carried one if fewer)
            lo = max(0, start - (c - 1))
            state = None
            if lo == 0:
                state = dict(carried)
                state.update(_unrows(torch.zeros_like(like), call.memory_keys))
            with torch.no_grad():
                _, st = call.run(*(x[:, lo:start] for x in xs), {g: x[:, lo:start] for g, x in gs.items()},
                                 state)
            out.update({w: st[w].to(carried[w].dtype) for w in CARRIED[:3]})
    if ANCHOR_POS in carried:
        out[ANCHOR_POS] = torch.remainder(carried[ANCHOR_POS] + start, rule.anchor)
    return out


def _piece_inputs(call: Call, plan, carried, q, k, v, gates, lengths, like) -> dict:
    """The inputs of this rank's pieces, ``{index in plan: (q, k, v, gates, carried)}``: its own
    slice's cut out, the others' received from their ranks (which send them here)."""
    r, out = call.rank, {}
    xs, names = (q, k, v), call.gate_names
    sends, recvs = [], []
    for i, pc in enumerate(plan):
        if pc.slice == r:
            cut = [x[:, pc.start:pc.end] for x in xs]
            gcut = {g: gates[g][:, pc.start:pc.end] for g in names}
            at = _window_at(call, carried, xs, gates, pc.start, like)
            if pc.worker == r:
                out[i] = (*cut, gcut, at)
            else:
                sends += [(pc.worker, x) for x in cut + [gcut[g] for g in names]]
                sends += [(pc.worker, at[w]) for w in CARRIED[:3] if w in at]
        elif pc.worker == r:  # another rank's tokens, shaped as this rank's
            n = pc.end - pc.start
            cut = [x.new_empty(x.shape[0], n, *x.shape[2:]) for x in xs]
            gcut = {g: gates[g].new_empty(gates[g].shape[0], n, *gates[g].shape[2:]) for g in names}
            at = {w: torch.empty_like(carried[w]) for w in CARRIED[:3] if w in carried}
            recvs += [(pc.slice, x) for x in cut + [gcut[g] for g in names]]
            recvs += [(pc.slice, at[w]) for w in CARRIED[:3] if w in at]
            if ANCHOR_POS in carried:  # the position of that slice's token pc.start
                pos0 = carried[ANCHOR_POS] - sum(lengths[:r])
                at[ANCHOR_POS] = torch.remainder(pos0 + sum(lengths[:pc.slice]) + pc.start, call.rule.anchor)
            out[i] = (*cut, gcut, at)
    exchange(call, sends, recvs)
    return out


class _Affine(torch.autograd.Function):
    @staticmethod
    def forward(ctx, call: Call, *tensors):
        s0, q, k, v, gates, params = call.unpack(tensors)
        keys = call.memory_keys
        r, R = call.rank, call.world
        first = r == 0
        lengths = None  # the slices' lengths: the map plan, a window's check, the anchor position
        if R > 2 or ANCHOR_POS in s0 or any(w in s0 for w in CARRIED[:3]):
            lengths = [int(x) for x in _gather(torch.tensor([q.shape[1]], device=q.device), call)]
        carried = _carried_inputs(call, s0, q, k, v, gates, lengths)
        rows0 = _rows(s0, keys).detach()
        n = rows0.shape[-1]
        chunk = _exact_chunk(call, q)
        with torch.enable_grad():
            carried_in = {key: leaf(x) for key, x in carried.items()}
            xs = [leaf(x) for x in (q, k, v)]
            gs = {g: leaf(x) for g, x in gates.items()}
            pieces = None
            if chunk is not None:  # the chunk form's pieces, once, for the maps and the run
                state = dict(carried_in)
                state.update(_unrows(torch.zeros_like(rows0), keys))
                p = call.rule.prepare(*xs, gs or None, state)
                pieces = exact_pieces(call.rule, p, chunk)

        def run(rows_in):
            with torch.enable_grad():
                if pieces is not None:
                    return _run_pieces(call, p, pieces, rows_in)
                state = dict(carried_in)
                state.update(_unrows(rows_in, keys))
                return call.run(*xs, gs, state)

        # the middle slices' maps, in pieces spread over the ranks (`map_plan`; probed maps
        # stay with their slice's rank, whose graph gives their g)
        quantum = _quantum(call)  # > 1: own pieces from the run's chunk pieces, others' formed anew
        plan = map_plan(lengths or [q.shape[1]] * R, quantum, balance=analytic_form(call.rule) is not None,
                        foreign=2 if quantum > 1 else 1)
        chain = Chain(plan, R)
        mine = [i for i, pc in enumerate(plan) if pc.worker == r]
        inputs = _piece_inputs(call, plan, carried, *(x.detach() for x in (q, k, v)),
                               {g: x.detach() for g, x in gates.items()}, lengths, rows0) if plan else {}
        maps = {}
        for i in mine:
            pc = plan[i]
            if pc.slice == r and pieces is not None:  # from the chunk pieces of this rank's run
                a, b = (x * call.rule.steps_per_token for x in (pc.start, pc.end))  # positions
                with torch.no_grad(), flush_subnormals():
                    maps[i] = SliceMap([chunk_maps(pieces, a // chunk, -(-b // chunk), b - a)],
                                       tree=n < state_map.TREE_BELOW)
            else:
                maps[i] = _piece_map(call, *inputs[i], rows0)
        bounds = Boundaries(call, chain, False, rows0)
        rows_in = None
        if first:  # its initial memory is s0: it runs its slice now and hands on its final memory
            rows_in = leaf(rows0)
            y, out = run(rows_in)
            bounds.put(0, _rows(out, keys))
        for i in mine:  # its pieces, in order: the memory at the piece's start carried through it
            bounds.put(i + 1, _apply(maps[i], bounds.get(i)))
        if not first:
            rows_in = leaf(bounds.get(chain.start[r]))
            y, out = run(rows_in)
        bounds.done()
        with torch.enable_grad():
            rows_out = _rows(out, keys)
        ctx.call, ctx.chain, ctx.maps = call, chain, maps
        ctx.graph = (y, rows_out, {w: out[w] for w in CARRIED[:3] if w in out})
        ctx.leaves = (rows_in, carried_in, xs, gs, params)
        outs = [out[key].detach() for key in call.state_keys]
        return (y.detach(), *outs)

    @staticmethod
    def backward(ctx, gy, *gstate):
        call, chain = ctx.call, ctx.chain
        plan = chain.plan
        r, R = call.rank, call.world
        last = r == R - 1
        y, rows_out, window_out = ctx.graph
        rows_in, carried_in, xs, gs, params = ctx.leaves
        keys = call.memory_keys
        gS = dict(zip(call.state_keys, gstate))
        zeros = torch.zeros_like(rows_out)
        g_S = torch.cat([g if (g := gS[key]) is not None else torch.zeros_like(part)
                         for key, part in zip(keys, rows_out.chunk(len(keys), dim=-1))], dim=-1)
        window = list(window_out)
        carried_leaves = [carried_in[w] for w in window]
        x_leaves = [*xs, *[gs[g] for g in call.gate_names], *params]

        def backward_of_slice(into_out):
            return grads([y, rows_out], [rows_in, *carried_leaves, *x_leaves], [gy, into_out],
                          retain=bool(window))

        every_gS = _gather(g_S, call)  # the caller's gradients of the ranks' final memories

        def plus_ends(x, k):  # x + the gS of the slices that end at boundary k
            for s, e in chain.end.items():
                if e == k:
                    x = x + every_gS[s]
            return x

        # the gradient at each boundary of everything after it, from the last rank back: the last
        # rank's is what its own backward of the slice gives at its initial memory; each piece
        # takes the one after it back through its chunks' maps, adding its outputs' reads
        # (`SliceMap.read_grad`, one pass; for a probed map, the slice's graph and its P)
        bounds = Boundaries(call, chain, True, zeros)
        got = None
        if last:
            got = backward_of_slice(g_S)
            bounds.put(chain.m, plus_ends(got[0] if got[0] is not None else zeros, chain.m))
        gys = _piece_grads(call, plan, gy) if plan else {}
        for i in sorted(ctx.maps, reverse=True):
            after = bounds.get(i + 1)
            bounds.put(i, plus_ends(_back(call, ctx.maps[i], gys[i], after, y, rows_in, gy), i))
        if got is None:  # the backward of the slice with the gradient at its final memory
            got = backward_of_slice(bounds.get(chain.end[r]))
        bounds.done()
        g_rows, g_carried, g_x = got[0], got[1:1 + len(window)], got[1 + len(window):]
        # the window inputs' gradient goes back to the rank whose last inputs they are
        g_window_in = {}
        if window:
            flat = [(g if g is not None else torch.zeros_like(carried_in[w])).reshape(
                carried_in[w].shape[0], -1) for w, g in zip(window, g_carried)]
            every = _gather(torch.cat(flat, dim=-1), call)
            g_window_in = dict(zip(window, g_carried))
            sizes = [carried_in[w][0].numel() for w in window]
            nxt = every[r + 1].split(sizes, dim=-1) if r + 1 < R else None
            g_wout = []
            for i, w in enumerate(window):
                g = gS.get(w)
                if nxt is not None:
                    g = add_grads(g, nxt[i].reshape(window_out[w].shape))
                g_wout.append(g)
            more = grads([window_out[w] for w in window], x_leaves, g_wout, retain=False)
            g_x = [add_grads(a, b) for a, b in zip(g_x, more)]
        # the initial state's gradient: rank 0's (the other ranks' s0 is not used)
        g_s0 = []
        g_rows_keys = _unrows(g_rows, keys) if g_rows is not None else {}
        for key in call.state_keys:
            if r != 0:
                g_s0.append(None)
            elif key in g_rows_keys:
                g_s0.append(g_rows_keys[key])
            else:
                g_s0.append(g_window_in.get(key))
        ctx.graph = ctx.leaves = ctx.maps = None
        return (None, *g_s0, *g_x)


def _piece_map(call: Call, q, k, v, gates, carried, like: torch.Tensor):
    """A piece's map: the chunks' maps of its chunk form (`state_map.slice_map`, not composed)
    or, without one, ``(P, C)`` probed with the rule (`_probe`; the piece is its rank's slice)."""
    if analytic_form(call.rule) is None:
        return _probe(call, q, k, v, gates, carried, like)
    state = dict(carried)
    state.update(_unrows(torch.zeros_like(like), call.memory_keys))
    with torch.no_grad():
        p = call.rule.prepare(q, k, v, gates or None, state)
        return slice_map(call.rule, p, call.memory_keys)


def _apply(piece, rows: torch.Tensor) -> torch.Tensor:
    """The memory after a piece from the memory before it (rows layout)."""
    if isinstance(piece, SliceMap):
        dtype = piece.runs[0].b.dtype
        return piece.apply(rows.to(dtype)).to(rows.dtype)
    P, C = piece
    return torch.baddbmm(C.flatten(0, 1), rows.flatten(0, 1), P.transpose(-1, -2).flatten(0, 1)).view(rows.shape)


def _back(call: Call, piece, gy_piece, after: torch.Tensor, y, rows_in, gy) -> torch.Tensor:
    """The gradient at a piece's initial memory: its outputs' (``gy_piece``) and ``after``'s,
    the gradient at its final memory (rows layout)."""
    if isinstance(piece, SliceMap):
        dtype = piece.runs[0].b.dtype
        return piece.read_grad(positions(call.rule, gy_piece).to(dtype), after.to(dtype)).to(after.dtype)
    P, _ = piece  # a probed piece is its rank's whole slice: its reads' gradient from its graph
    (g,) = grads([y], [rows_in], [gy], retain=True)
    g = torch.zeros_like(after) if g is None else g
    return torch.baddbmm(g.flatten(0, 1), after.flatten(0, 1), P.flatten(0, 1)).view(after.shape)


def _piece_grads(call: Call, plan, gy: torch.Tensor) -> dict:
    """The output gradients of this rank's pieces, ``{index in plan: [B, n, H, Dv]}``: its own
    slice's cut out, the others' received from their ranks (which send them here)."""
    r, out, sends, recvs = call.rank, {}, [], []
    for i, pc in enumerate(plan):
        if pc.slice == r and pc.worker != r:
            sends.append((pc.worker, gy[:, pc.start:pc.end]))
        elif pc.worker == r and pc.slice != r:
            out[i] = gy.new_empty(gy.shape[0], pc.end - pc.start, *gy.shape[2:])
            recvs.append((pc.slice, out[i]))
        elif pc.worker == r:
            out[i] = gy[:, pc.start:pc.end]
    exchange(call, sends, recvs)
    return out


# -- the entry point ---------------------------------------------------------------------------------
def context_parallel(rule, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                     gates: Mapping[str, torch.Tensor] | None = None, state=None, *, group=None,
                     strategy: Any = None, mode: str = "auto"):
    """This rank's slice of one sequence split along time over the ranks of ``group``; returns
    ``(y [B, T_r, H, Dv], state after this slice)``. See the module docstring."""
    if not dist.is_initialized():
        raise RuntimeError("context_parallel needs a process group: call "
                           "torch.distributed.init_process_group first")
    group = group if group is not None else dist.group.WORLD
    world, rank = dist.get_world_size(group), dist.get_rank(group)
    gates = dict(gates or {})
    if world == 1:
        return type(rule).forward(rule, q, k, v, gates=gates or None, state=state, strategy=strategy)
    chosen = mode_for(rule, mode)
    if state is None:
        if not rule.composed:
            raise ValueError("context_parallel builds the initial state of knob-composed rules "
                             "only; pass state= (the rule's state before the first token)")
        if not rule.structure.bound:
            rule.bind(q.shape[2], q.shape[3], v.shape[3])
        cdtype = torch.float32 if q.dtype in (torch.float16, torch.bfloat16) else q.dtype
        state = rule.init_state(q.shape[0], dtype=cdtype, device=q.device)
    state_keys = sorted(state)
    gate_names = sorted(gates)
    params = [p for p in rule.parameters() if p.requires_grad]
    call = Call(rule, strategy, group, rank, world, dist.get_process_group_ranks(group),
                 state_keys, gate_names, len(params))
    tensors = [state[key] for key in state_keys] + [q, k, v] + [gates[g] for g in gate_names] + params
    if chosen == "affine":
        call.memory_keys = [key for key in state_keys if key not in CARRIED]
        out = _Affine.apply(call, *tensors)
    else:
        from .relay import Relay  # (the relay mode's own module)

        out = Relay.apply(call, *tensors)
    return out[0], dict(zip(state_keys, out[1:]))
