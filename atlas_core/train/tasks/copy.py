"""Copying: read a random sequence, then reproduce it after a separator.

The token stream of one row (length T + 1, shifted by one into inputs and targets):

    x_1 x_2 ... x_L  SEP  x_1 x_2 ... x_L  PAD ... PAD

with ``x_i`` uniform over the data symbols ``[2, V)`` (0 = PAD, 1 = SEP). ``inputs`` is the first
T tokens, ``targets`` the next-token shift of the stream, kept only where the next token is part
of the copy (input positions ``L .. 2L - 1``, i.e. from SEP to ``x_{L-1}``); all other targets are
-100. A model must hold L tokens in its state to score: the task measures memory capacity.

Tensors: ``inputs, targets: LongTensor [B, T]``.
"""

from __future__ import annotations

import torch
from pydantic import ValidationInfo, field_validator
from ...params import size_field

from ...host.registry import Params
from .base import IGNORE_INDEX, Task

PAD = 0
SEP = 1


class CopyParams(Params):
    vocab_size: int = size_field(16, "vocab", ge=3, description="V: 0 = pad, 1 = separator, [2, V) data")
    seq_len: int = size_field(128, "seq_len", ge=2, description="T, tokens per row")
    copy_len: int | None = size_field(None, "seq_len", ge=1, description="L, tokens to copy; default (none) uses seq_len // 2"
    )

    @field_validator("copy_len")
    @classmethod
    def _fits(cls, length: int | None, info: ValidationInfo) -> int | None:
        seq_len = info.data.get("seq_len")
        if length is not None and seq_len is not None and seq_len < 2 * length:
            raise ValueError(
                f"copy_len={length} needs seq_len >= 2 * copy_len = {2 * length} (the sequence, "
                f"then its copy), but seq_len is {seq_len}; raise seq_len or lower copy_len to "
                f"<= {seq_len // 2}"
            )
        return length


class CopyTask(Task):
    """Copy a random sequence after a separator; see the module docstring."""

    name = "copy"
    Params = CopyParams

    @property
    def vocab_size(self) -> int:
        return self.params.vocab_size

    @property
    def copy_len(self) -> int:
        p = self.params
        return p.copy_len if p.copy_len is not None else p.seq_len // 2

    def _sample(self, batch_size, generator):
        T, L, V = self.params.seq_len, self.copy_len, self.params.vocab_size
        data = torch.randint(2, V, (batch_size, L), generator=generator)
        stream = torch.full((batch_size, T + 1), PAD, dtype=torch.long)
        stream[:, :L] = data
        stream[:, L] = SEP
        stream[:, L + 1 : 2 * L + 1] = data
        targets = torch.full((batch_size, T), IGNORE_INDEX, dtype=torch.long)
        targets[:, L : 2 * L] = stream[:, L + 1 : 2 * L + 1]
        return stream[:, :T].clone(), targets
