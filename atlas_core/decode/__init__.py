"""Decoding: `Decoder` (core:lm's fast token-by-token path, `atlas_core.decode.engine`) and
`generate` (batched, streamed generation for any `MemoryLM`).

    from atlas_core.decode import generate
    for event in generate(model, [prompt_a, prompt_b], max_new_tokens=64, greedy=True):
        ...   # event.row, event.token, event.position: each new token as it comes

`generate` prefills every prompt (each alone, in pieces that carry the state), then decodes all
rows together, one token a row a step, each row exactly as it would alone (its own state and
position). It runs `Decoder` where it supports the model and ``model.step`` one row at a time
otherwise (`atlas_core.decode.engine.supports` says why).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Iterator

import torch

from .engine import Decoder, supports
from .norm import argmax


@dataclass(frozen=True)
class Token:
    """One generated token: its row (prompt), the token id and its position in the row."""

    row: int
    token: int
    position: int


def _sample(logits: torch.Tensor, usable: int | None, choose) -> torch.Tensor:
    last = logits.float()
    if usable is not None and usable < last.shape[-1]:
        last = last.clone()
        last[:, usable:] = float("-inf")
    if choose.is_greedy:  # Sampling's own choice, by the compiled argmax
        return argmax(last.contiguous())
    return choose(last)


@torch.no_grad()
def generate(model, prompts: list[torch.Tensor] | torch.Tensor, max_new_tokens: int = 64, *,
             usable: int | None = None, max_len: int | None = None, fast: bool = True,
             **sampling) -> Iterator[Token]:
    """Yield each new token of each prompt as it is decoded (module docstring). ``usable``: sample
    among the first ``usable`` ids only; ``sampling``: the fields of `atlas_core.model.Sampling`
    (``greedy``, ``temperature``, ``top_k``, ``top_p``, ``generator``); ``fast=False`` decodes
    through ``model.step`` (the reference)."""
    from ..model import Sampling

    choose = Sampling(**sampling)
    rows = [p.reshape(-1) for p in (list(prompts) if isinstance(prompts, (list, tuple)) else prompts.unbind(0))]
    if not rows or any(r.numel() == 0 for r in rows):
        raise ValueError("every prompt must hold at least one token")
    if max_new_tokens < 0:
        raise ValueError(f"max_new_tokens={max_new_tokens} must be >= 0")
    for r in rows:
        model.check_ids(r[None])
    if fast and supports(model)[0]:
        longest = max(r.numel() for r in rows)
        dec = Decoder(model, batch=len(rows), max_len=max_len or longest + max_new_tokens + 1)
        logits = dec.prefill(rows)
        for i in range(max_new_tokens):
            nxt = _sample(logits, usable, choose)
            for b, t in enumerate(nxt.tolist()):
                yield Token(b, t, rows[b].numel() + i)
            if i + 1 < max_new_tokens:
                logits = dec.step(nxt)
        return
    states, logits = [], []
    for r in rows:  # the reference path: model.step, one row at a time
        lg, st = model.step(r[None].to(next(model.parameters()).device), None)
        states.append(st)
        logits.append(lg[:, -1])
    for i in range(max_new_tokens):
        for b in range(len(rows)):
            nxt = _sample(logits[b], usable, choose)
            yield Token(b, int(nxt[0]), rows[b].numel() + i)
            if i + 1 < max_new_tokens:
                lg, states[b] = model.step(nxt[:, None], states[b])
                logits[b] = lg[:, -1]


__all__ = ["Decoder", "Token", "generate", "supports"]
