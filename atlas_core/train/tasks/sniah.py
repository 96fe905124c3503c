"""Single needle in a haystack (RULER's S-NIAH, Hsieh et al. 2024), on token ids.

The token stream of one row (length T + 1, shifted by one into inputs and targets):

    f f f f ... f  key v_1..v_n  f f ... f  QUERY key  v_1 .. v_n
    <------ haystack of H = T - 1 - n tokens, needle at depth d ------>

- the haystack is filler drawn uniformly from the filler range, which shares no id with keys or
  values, so the needle is the only place the key occurs before the question;
- the needle ``key v_1 .. v_n`` (one key id, ``n = value_len`` value ids) starts at depth ``d``:
  uniform over the haystack by default, or ``round(depth * (H - n - 1))`` when ``depth`` in
  ``[0, 1]`` is given (0 = the start of the context, 1 = right before the question), as RULER
  sweeps needle depth;
- the question ``QUERY key`` closes the context and the answer ``v_1 .. v_n`` follows; targets are
  kept only on the answer (input positions ``T - n .. T - 1``, from the queried key to
  ``v_{n-1}``), all others are -100.

The context length is ``seq_len``. Vocabulary: 0 = PAD (unused), 1 = QUERY, then three equal
ranges of ``K = (V - 2) // 3`` ids: keys ``[2, 2 + K)``, values ``[2 + K, 2 + 2K)`` and filler
``[2 + 2K, V)``.

Tensors: ``inputs, targets: LongTensor [B, T]``.
"""

from __future__ import annotations

import torch
from pydantic import Field, ValidationInfo, field_validator
from ...params import size_field

from ...host.registry import Params
from .base import IGNORE_INDEX, Task

QUERY = 1


class SNIAHParams(Params):
    vocab_size: int = size_field(256, "vocab", ge=5, description="V: QUERY, then keys, values, filler ranges")
    seq_len: int = size_field(1024, "seq_len", ge=4, description="T, the context length (tokens per row)")
    value_len: int = size_field(1, "seq_len", ge=1, description="n, value tokens in the needle and the answer")
    depth: float | None = Field(
        None, ge=0.0, le=1.0, description="needle depth in [0, 1]; none draws it uniformly"
    )

    @field_validator("value_len")
    @classmethod
    def _fits(cls, n: int, info: ValidationInfo) -> int:
        seq_len = info.data.get("seq_len")
        if seq_len is not None and seq_len < 2 * n + 2:
            raise ValueError(
                f"value_len={n} needs seq_len >= 2 * value_len + 2 = {2 * n + 2} (the needle, "
                f"the question and the answer), but seq_len is {seq_len}; raise seq_len or "
                f"lower value_len to <= {(seq_len - 2) // 2}"
            )
        return n


class SNIAHTask(Task):
    """Retrieve the value of the one needle hidden in filler; see the module docstring."""

    name = "sniah"
    Params = SNIAHParams

    @property
    def vocab_size(self) -> int:
        return self.params.vocab_size

    @property
    def ranges(self) -> dict[str, tuple[int, int]]:
        """``[low, high)`` of the key, value and filler ids."""
        k = (self.params.vocab_size - 2) // 3
        return {
            "key": (2, 2 + k),
            "value": (2 + k, 2 + 2 * k),
            "filler": (2 + 2 * k, self.params.vocab_size),
        }

    @property
    def haystack_len(self) -> int:
        """H, stream tokens before the question (filler and needle)."""
        return self.params.seq_len - 1 - self.params.value_len

    def _sample(self, batch_size, generator):
        p = self.params
        B, T, n = batch_size, p.seq_len, p.value_len
        H = self.haystack_len
        r = self.ranges
        stream = torch.randint(*r["filler"], (B, T + 1), generator=generator)
        key = torch.randint(*r["key"], (B, 1), generator=generator)
        value = torch.randint(*r["value"], (B, n), generator=generator)
        needle = torch.cat([key, value], dim=1)  # [B, 1 + n]

        last = H - (1 + n)  # the deepest start that keeps the needle in the haystack
        if p.depth is None:
            start = torch.randint(0, last + 1, (B, 1), generator=generator)
        else:
            start = torch.full((B, 1), round(p.depth * last), dtype=torch.long)
        stream.scatter_(1, start + torch.arange(1 + n), needle)

        stream[:, H] = QUERY
        stream[:, H + 1 :] = needle  # the queried key, then the answer: H + 2 + n = T + 1
        targets = torch.full((B, T), IGNORE_INDEX, dtype=torch.long)
        targets[:, H + 1 :] = value
        return stream[:, :T].clone(), targets
