"""Selective copying (Mamba, Gu & Dao 2023, Sec. 3.1): copy only the data tokens of a noisy span.

The token stream of one row (length T + 1, shifted by one into inputs and targets):

    NOISE x_1 NOISE NOISE x_2 ... NOISE x_N NOISE  SEP  x_1 x_2 ... x_N  PAD ... PAD
    <----------------- span of S tokens ---------->

The N data tokens ``x_i`` (uniform over ``[3, V)``; 0 = PAD, 1 = SEP, 2 = NOISE) sit at N
distinct random positions of the span, in order; the other span positions hold the noise token.
After SEP the model must emit the data tokens in order, skipping the noise: a content-dependent
(selective) memory task. Targets are kept only on the copy (input positions ``S .. S + N - 1``,
from SEP to ``x_{N-1}``); all others are -100.

Tensors: ``inputs, targets: LongTensor [B, T]``.
"""

from __future__ import annotations

import torch
from pydantic import ValidationInfo, field_validator
from ...params import size_field

from ...host.registry import Params
from .base import IGNORE_INDEX, Task, distinct_ints

PAD = 0
SEP = 1
NOISE = 2


class SelectiveCopyParams(Params):
    vocab_size: int = size_field(16, "vocab", ge=4, description="V: 0 pad, 1 separator, 2 noise, [3, V) data")
    seq_len: int = size_field(256, "seq_len", ge=2, description="T, tokens per row")
    num_tokens: int = size_field(16, "seq_len", ge=1, description="N, data tokens scattered in the span")
    span_len: int | None = size_field(None, "seq_len", ge=1, description="S, length of the noisy span; default (none) is seq_len - N"
    )

    @field_validator("num_tokens")
    @classmethod
    def _tokens_fit(cls, n: int, info: ValidationInfo) -> int:
        seq_len = info.data.get("seq_len")
        if seq_len is not None and seq_len < 2 * n:
            raise ValueError(
                f"num_tokens={n} needs seq_len >= 2 * num_tokens = {2 * n} (a span holding the "
                f"tokens, then their copy), but seq_len is {seq_len}; raise seq_len or lower "
                f"num_tokens to <= {seq_len // 2}"
            )
        return n

    @field_validator("span_len")
    @classmethod
    def _span_fits(cls, span: int | None, info: ValidationInfo) -> int | None:
        seq_len, n = info.data.get("seq_len"), info.data.get("num_tokens")
        if span is None or seq_len is None or n is None:
            return span
        if span < n:
            raise ValueError(
                f"span_len={span} cannot hold num_tokens={n} data tokens; raise span_len to "
                f">= {n}"
            )
        if span + n > seq_len:
            raise ValueError(
                f"span_len={span} plus the copy of num_tokens={n} needs seq_len >= {span + n}, "
                f"but seq_len is {seq_len}; lower span_len to <= {seq_len - n} or raise seq_len"
            )
        return span


class SelectiveCopyTask(Task):
    """Copy the data tokens scattered in a noisy span; see the module docstring."""

    name = "selective_copy"
    Params = SelectiveCopyParams

    @property
    def vocab_size(self) -> int:
        return self.params.vocab_size

    @property
    def span_len(self) -> int:
        p = self.params
        return p.span_len if p.span_len is not None else p.seq_len - p.num_tokens

    def _sample(self, batch_size, generator):
        p = self.params
        B, T, N, S, V = batch_size, p.seq_len, p.num_tokens, self.span_len, p.vocab_size
        data = torch.randint(3, V, (B, N), generator=generator)
        # Sorted, so that the i-th data token in the span is the i-th one to copy.
        where = distinct_ints(B, N, 0, S, generator).sort(dim=-1).values  # [B, N]

        stream = torch.full((B, T + 1), PAD, dtype=torch.long)
        stream[:, :S] = NOISE
        stream[:, :S].scatter_(1, where, data)
        stream[:, S] = SEP
        stream[:, S + 1 : S + 1 + N] = data

        targets = torch.full((B, T), IGNORE_INDEX, dtype=torch.long)
        targets[:, S : S + N] = data
        return stream[:, :T].clone(), targets
