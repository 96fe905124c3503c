"""Packed variable-length sequences: documents laid end to end in one row, ``cu_seqlens``.

A packed call holds ``N`` documents of lengths ``l_1 .. l_N`` in one row (batch size 1)::

    cu_seqlens = [0, l_1, l_1 + l_2, ..., T]          # LongTensor [N + 1]

and computes, for every document, exactly what a call on that document alone computes: each
document starts from the initial state (or from its own row of a per-document state, batch N),
nothing crosses a boundary, and the final state holds one row per document (batch N).

- `check_cu_seqlens`: the validation every packed entry point runs (one message naming the
  value and the fix);
- `packed_call`: a rule call over packed documents. It runs the rule's bound strategy on the
  documents themselves — the strategy contract (any split of a sequence into calls equals one
  call, docs/math.md) makes that exact for every strategy, with no padding to a chunk size.
  Documents of equal length (and equal per-document scalars in the state, e.g. an anchor
  position) run together as one batched call;
- `packed_short_conv`: a layer's causal short convolution over packed documents (each document
  starts from zeros or its own carried inputs);
- `document_ids`, `per_document`: per-token document numbers, and a function applied to each
  document separately (equal lengths batched), for models without a packed path of their own.
"""

from __future__ import annotations

import inspect
from typing import Any, Callable, Mapping, Sequence

import torch

FIX = ("pass cu_seqlens = torch.tensor([0, l1, l1 + l2, ..., T], dtype=torch.long): the "
       "cumulative document lengths of a batch-1 packed row")


def check_cu_seqlens(cu_seqlens: Any, total: int, batch: int = 1,
                     name: str = "cu_seqlens") -> list[int]:
    """The boundaries as a list of ints, after checking that ``cu_seqlens`` is an integer tensor
    ``[N + 1]`` with ``N >= 1``, starting at 0, strictly increasing (every document holds at
    least one token) and ending at ``total`` tokens, for inputs of batch size 1."""
    if isinstance(cu_seqlens, torch.Tensor):
        if cu_seqlens.dtype not in (torch.int32, torch.int64):
            raise ValueError(f"{name} must be an integer tensor (int32 or int64), got dtype "
                             f"{cu_seqlens.dtype}; {FIX}")
        if cu_seqlens.dim() != 1 or cu_seqlens.numel() < 2:
            raise ValueError(f"{name} must be one-dimensional [N + 1] with N >= 1 documents, got "
                             f"shape {tuple(cu_seqlens.shape)}; {FIX}")
        cu = [int(c) for c in cu_seqlens.tolist()]
    else:
        raise ValueError(f"{name} must be a torch.Tensor, got {type(cu_seqlens).__name__}; {FIX}")
    if batch != 1:
        raise ValueError(f"with {name} the inputs hold one packed row (batch size 1), got batch "
                         f"size {batch}; lay the documents end to end in one row and list their "
                         "boundaries in cu_seqlens")
    shown = cu if len(cu) <= 12 else cu[:6] + ["..."] + cu[-3:]
    if cu[0] != 0:
        raise ValueError(f"{name} must start at 0, got {shown}; {FIX}")
    if cu[-1] != total:
        raise ValueError(f"{name} must end at the number of tokens T = {total}, got {shown} "
                         f"(last {cu[-1]}); {FIX}")
    bad = next((i for i in range(1, len(cu)) if cu[i] <= cu[i - 1]), None)
    if bad is not None:
        raise ValueError(f"{name} must be strictly increasing (every document holds at least one "
                         f"token), got {cu[bad - 1]} then {cu[bad]} at entries {bad - 1}, {bad} of "
                         f"{shown}; " + ("drop empty documents from cu_seqlens" if cu[bad] == cu[bad - 1]
                                      else "list cumulative lengths, each entry the previous plus a length"))
    return cu


def document_ids(cu: Sequence[int], device=None) -> torch.Tensor:
    """``[T]`` int64: the document number of every token."""
    lengths = torch.tensor([b - a for a, b in zip(cu, cu[1:])], device=device)
    return torch.repeat_interleave(torch.arange(len(cu) - 1, device=device), lengths)


# -- rule calls ----------------------------------------------------------------------------------
def _time_tensors(value: Any) -> list[torch.Tensor]:
    if isinstance(value, torch.Tensor):
        return [value]
    if isinstance(value, dict):
        return [t for t in value.values() if isinstance(t, torch.Tensor)]
    return []


def _take(value: Any, docs: Sequence[tuple[int, int]]) -> Any:
    """The documents ``docs`` ((start, end) of equal length) of a ``[1, T, ...]`` value, stacked
    along the batch: ``[n, L, ...]`` (one level of dicts of tensors too)."""
    if isinstance(value, torch.Tensor):
        if len(docs) == 1:
            return value[:, docs[0][0]:docs[0][1]]
        return torch.cat([value[:, a:b] for a, b in docs], dim=0)
    if isinstance(value, dict):
        return {k: _take(t, docs) for k, t in value.items()}
    return value


def packed_call(run: Callable[[tuple, dict], tuple], signature: Callable, args: tuple, kwargs: dict,
                cu_seqlens: Any) -> tuple[torch.Tensor, dict]:
    """``run(args, kwargs) -> (y, state)`` (one rule call) over the packed documents of
    ``cu_seqlens``: ``(y [1, T, ...], state with batch N)``.

    ``signature`` is the rule's ``prepare`` (its parameters name the arguments); every tensor
    argument but ``state`` (and every tensor of a dict argument, e.g. ``gates``) is ``[1, T, ...]``
    and is cut along time; ``state`` (None or one row per document) is cut along the batch."""
    bound = inspect.signature(signature).bind(*args, **kwargs)
    named = dict(bound.arguments)
    state = named.pop("state", None)
    tensors = [t for v in named.values() for t in _time_tensors(v)]
    if not tensors:
        raise ValueError("cu_seqlens cuts the call's tensors along time, but the call has none")
    ref = tensors[0]
    if ref.dim() < 2:
        raise ValueError(f"with cu_seqlens every input is [1, T, ...], got shape {tuple(ref.shape)}")
    T = ref.shape[1]
    cu = check_cu_seqlens(cu_seqlens, T, ref.shape[0])
    for name, value in named.items():
        for t in _time_tensors(value):
            if t.dim() < 2 or t.shape[0] != 1 or t.shape[1] != T:
                raise ValueError(f"with cu_seqlens every input is one packed row [1, T = {T}, ...]; "
                                 f"{name} has shape {tuple(t.shape)}")
    N = len(cu) - 1
    if state is not None:
        if not isinstance(state, Mapping):
            raise ValueError(f"state must be a mapping of named tensors, got {type(state).__name__}")
        for key, t in state.items():
            if not isinstance(t, torch.Tensor) or t.dim() < 1 or t.shape[0] != N:
                shape = tuple(t.shape) if isinstance(t, torch.Tensor) else type(t).__name__
                raise ValueError(
                    f"state['{key}'] has shape {shape}, but with cu_seqlens the state holds one "
                    f"row per document: batch N = {N} (pass the state a packed call returned, or "
                    "None to start every document afresh)")
    docs = list(zip(cu, cu[1:]))
    # documents that can run as one batched call: equal length and equal per-document scalars
    # in the state (a rule may need one value of e.g. its anchor position for a whole batch)
    flags = [] if state is None else [k for k, t in state.items() if t.dim() == 1]
    groups: dict[tuple, list[int]] = {}
    for i, (a, b) in enumerate(docs):
        key = (b - a, *(tuple(state[k][i].reshape(-1).tolist()) for k in flags))
        groups.setdefault(key, []).append(i)
    ys: list[Any] = [None] * N
    states: list[tuple[list[int], dict]] = []
    for members in groups.values():
        part = [docs[i] for i in members]
        call = {name: _take(value, part) for name, value in named.items()}
        if state is not None:
            index = torch.tensor(members, device=next(iter(state.values())).device)
            call["state"] = {k: t.index_select(0, index) for k, t in state.items()}
        y, st = run((), call)
        for j, i in enumerate(members):
            ys[i] = y[j : j + 1]
        states.append((members, st))
    y = torch.cat(ys, dim=1) if N > 1 else ys[0]
    return y, _merge_states(states, N)


def _merge_states(states: list[tuple[list[int], dict]], N: int) -> dict:
    """One state of batch N, document order, from the groups' states."""
    if len(states) == 1 and states[0][0] == list(range(N)):
        return states[0][1]
    order = [i for members, _ in states for i in members]
    inverse = torch.empty(N, dtype=torch.long)
    inverse[torch.tensor(order)] = torch.arange(N)
    out = {}
    for key in states[0][1]:
        whole = torch.cat([st[key] for _, st in states], dim=0)
        out[key] = whole.index_select(0, inverse.to(whole.device))
    return out


# -- the short convolution -----------------------------------------------------------------------
def _source(pos: torch.Tensor, doc: torch.Tensor, start: torch.Tensor, K: int, N: int) -> torch.Tensor:
    """Indices into ``cat([cache.reshape(N (K-1), C), x])`` of the inputs at token positions
    ``pos`` of document ``doc`` (which starts at ``start``): a position before the document's start
    reads the document's carried inputs."""
    offset = pos - start  # < 0: the carried inputs, -1 the newest
    return torch.where(offset >= 0, N * (K - 1) + pos, doc * (K - 1) + (K - 1) + offset)


def packed_short_conv(conv, x: torch.Tensor, cache: torch.Tensor | None, cu: Sequence[int]):
    """`atlas_core.layer.ShortConv` over packed documents: ``x: [1, T, C]``, ``cache`` None or
    ``[N, K - 1, C]`` (each document's carried inputs). Returns ``(y [1, T, C], cache [N, K-1, C])``;
    no output reads an input of another document."""
    K, (_, T, C), N = conv.kernel, x.shape, len(cu) - 1
    if cache is None:
        cache = x.new_zeros(N, K - 1, C)
    elif tuple(cache.shape) != (N, K - 1, C):
        raise ValueError(f"the convolution state has shape {tuple(cache.shape)}, but with "
                         f"cu_seqlens it holds one row per document: [N, K - 1, C] = {[N, K - 1, C]}")
    dev = x.device
    doc = document_ids(cu, dev)
    starts = torch.tensor(cu[:-1], device=dev)
    src = torch.cat([cache.to(x.dtype).reshape(N * (K - 1), C), x[0]], dim=0)
    w = conv.weight[:, 0].to(x.dtype)  # (C, K): tap j reads the input K - 1 - j tokens back
    t = torch.arange(T, device=dev)
    y = None
    for j in range(K):
        idx = _source(t - (K - 1 - j), doc, starts[doc], K, N)
        term = src.index_select(0, idx) * w[:, j]
        y = term if y is None else y + term
    ends = torch.tensor(cu[1:], device=dev)
    pos = ends[:, None] - (K - 1) + torch.arange(K - 1, device=dev)  # [N, K - 1]
    docs = torch.arange(N, device=dev)[:, None].expand_as(pos)
    idx = _source(pos, docs, starts[:, None].expand_as(pos), K, N)
    new_cache = src.index_select(0, idx.reshape(-1)).reshape(N, K - 1, C)
    return y.unsqueeze(0), new_cache


# -- models without a packed path ----------------------------------------------------------------
def per_document(fn: Callable[[torch.Tensor], torch.Tensor], x: torch.Tensor,
                 cu: Sequence[int]) -> torch.Tensor:
    """``fn`` (``[n, L, ...] -> [n, L, ...]``) on each document of ``x: [1, T, ...]`` separately
    (documents of equal length batched together), the results packed again: ``[1, T, ...]``."""
    docs = list(zip(cu, cu[1:]))
    groups: dict[int, list[int]] = {}
    for i, (a, b) in enumerate(docs):
        groups.setdefault(b - a, []).append(i)
    out: list[Any] = [None] * len(docs)
    for members in groups.values():
        y = fn(torch.cat([x[:, docs[i][0]:docs[i][1]] for i in members], dim=0))
        for j, i in enumerate(members):
            out[i] = y[j : j + 1]
    return torch.cat(out, dim=1)


# -- packed training rows ------------------------------------------------------------------------
def pack_rows(rows: torch.Tensor, starts: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Rows ``[B, T]`` whose documents begin where ``starts: Bool [B, T]`` is True (every row
    starts a document at 0) as one packed row ``[1, B T]`` and its ``cu_seqlens``."""
    if starts.shape != rows.shape or starts.dtype != torch.bool or (rows.numel() and not bool(starts[:, 0].all())):
        raise ValueError(f"starts must be a bool tensor {tuple(rows.shape)} that is True at the "
                         "first position of every row")
    flat = starts.reshape(-1)
    edges = torch.nonzero(flat).squeeze(1)
    cu = torch.cat([edges, edges.new_tensor([flat.numel()])])
    return rows.reshape(1, -1), cu
