"""Multi-query associative recall (MQAR), as defined by Zoology (Arora et al. 2023, Sec. 3.1).

A row of length T holds N key-value pairs, then queries:

    k_1 v_1 k_2 v_2 ... k_N v_N | . . k_3 . . . k_1 . k_N . . .
    <------- context 2N ------>   <-------- T - 2N query region -------->

- the vocabulary is split in half: keys come from ``[1, V // 2)`` (0 is Zoology's pad id), values
  from ``[V // 2, V)``; keys are distinct within a row and so are values;
- the query region is cut into ``S = (T - 2N) // 2`` two-token slots; each key is asked once, in
  slot ``g`` (position ``2N + 2g``), the N slots drawn without replacement with the power law
  ``P(g) ∝ (g + 1) ** (a - 1)`` (Zoology's ``power_a``, default 0.01): short gaps after the context
  are far more likely than long ones, and ``a = 1`` makes them uniform;
- the target at a query key's position is its value (the token right after the key); every other
  target is -100, so the loss and the accuracy count only the N recalls;
- every other input position is noise drawn uniformly from the whole vocabulary (Zoology's
  ``random_non_queries``), or pad 0 with ``noise = false``.

Tensors: ``inputs, targets: LongTensor [B, T]``.
"""

from __future__ import annotations

import torch
from pydantic import Field, ValidationInfo, field_validator
from ...params import size_field

from ...host.registry import Params
from .base import IGNORE_INDEX, Task, distinct_ints


class MQARParams(Params):
    vocab_size: int = size_field(8192, "vocab", ge=4, description="V: keys from [1, V/2), values from [V/2, V)")
    seq_len: int = size_field(256, "seq_len", ge=4, description="T, tokens per row")
    num_pairs: int = size_field(16, "seq_len", ge=1, description="N, key-value pairs per row (num_kv_pairs)")
    power_a: float = Field(0.01, gt=0.0, le=1.0, description="power-law exponent of query gaps")
    noise: bool = Field(True, description="fill unused positions with random tokens, not pad 0")

    @field_validator("num_pairs")
    @classmethod
    def _fits(cls, n: int, info: ValidationInfo) -> int:
        seq_len = info.data.get("seq_len")
        vocab = info.data.get("vocab_size")
        if seq_len is not None and seq_len < 4 * n:
            raise ValueError(
                f"num_pairs={n} needs seq_len >= 4 * num_pairs = {4 * n} (2N context tokens, "
                f"then N query slots of 2 tokens), but seq_len is {seq_len}; raise seq_len or "
                f"lower num_pairs to <= {seq_len // 4}"
            )
        if vocab is not None and vocab // 2 - 1 < n:
            raise ValueError(
                f"num_pairs={n} needs {n} distinct keys in [1, vocab_size // 2), so vocab_size "
                f">= {2 * n + 2}, but vocab_size is {vocab}; raise vocab_size or lower num_pairs "
                f"to <= {max(vocab // 2 - 1, 0)}"
            )
        return n


class MQARTask(Task):
    """Zoology's multi-query associative recall; see the module docstring."""

    name = "mqar"
    Params = MQARParams

    @property
    def vocab_size(self) -> int:
        return self.params.vocab_size

    @property
    def num_slots(self) -> int:
        """S, the number of two-token query slots after the context."""
        p = self.params
        return (p.seq_len - 2 * p.num_pairs) // 2

    def gap_probabilities(self) -> torch.Tensor:
        """``[S]`` float64: the power-law law of the slot a query lands in (before exclusion)."""
        a = self.params.power_a
        i = torch.arange(1, self.num_slots + 1, dtype=torch.float64)
        p = a * i ** (a - 1)
        return p / p.sum()

    def _sample(self, batch_size, generator):
        p = self.params
        B, T, N, V = batch_size, p.seq_len, p.num_pairs, p.vocab_size
        half = V // 2
        keys = distinct_ints(B, N, 1, half, generator)  # [B, N]
        values = distinct_ints(B, N, half, V, generator)  # [B, N]

        inputs = torch.zeros(B, T, dtype=torch.long)
        used = torch.zeros(B, T, dtype=torch.bool)
        inputs[:, 0 : 2 * N : 2] = keys
        inputs[:, 1 : 2 * N : 2] = values
        used[:, : 2 * N] = True

        # Slot g of key j, without replacement so that no two queries share a slot.
        law = self.gap_probabilities().expand(B, -1)
        slots = torch.multinomial(law, N, replacement=False, generator=generator)  # [B, N]
        where = 2 * N + 2 * slots  # [B, N] positions of the query keys
        inputs.scatter_(1, where, keys)
        used.scatter_(1, where, True)

        targets = torch.full((B, T), IGNORE_INDEX, dtype=torch.long)
        targets.scatter_(1, where, values)

        if p.noise:
            fill = torch.randint(0, V, (B, T), generator=generator)
            inputs = torch.where(used, inputs, fill)
        return inputs, targets
