"""`AtlasMemoryCache`: the decoding state of an atlas model, as a Hugging Face ``generate`` cache.

It wraps the state that the model's own ``step(ids, state)`` carries (`atlas_core.model.MemoryLM`),
unchanged, so Hugging Face decoding runs exactly the calls of ``MemoryLM.generate``: the prompt in
one call, then one token per call. Per block, that state is (`tensors` lists it by path):

- a memory layer's state (``core:lm``, MAG, MAL, MAC): the memory (``M`` of a linear memory,
  ``W1``, ``W2``, ... of a deep one), the optimiser's carried terms (``Z.*``: momentum), the
  anchor block's start memory and the position within it (``anchor.*``), the last
  ``conv_size - 1`` inputs of the short convolutions (``conv.q|k|v``) and, with ``[layer]
  rotary``, the number of tokens seen (``pos``);
- sliding-window attention (MAG, MAL, and the attention-only blocks of any hybrid): the keys and
  values of the persistent tokens (``pk``, ``pv``) and of the last ``window - 1`` tokens (``k``,
  ``v``), and the position (``pos``);
- a MAC block: the persistent keys/values, the memory committed at the last segment boundary
  (``committed``) and the open segment's keys, values and outputs (``buf``, under
  ``segment_size`` tokens);
- MRU-LM: each block's matrix state ``H``.

None of it grows past these bounds, however long the sequence. The cache belongs to one batch:
it cannot be cropped, reordered for beam search or shared between batches.
"""

from __future__ import annotations

from typing import Any, Iterator

import torch


class AtlasMemoryCache:
    """The carried state of one batch; ``seen_tokens`` counts the positions already consumed."""

    is_compileable = False
    is_croppable = False
    # Per layer, whether its cache is a fixed-size recurrent state rather than growing keys and
    # values: always (transformers then leaves the slicing of the ids to the model).
    is_linear = (True,)

    def __init__(self) -> None:
        self.state: Any = None
        self.seen_tokens = 0

    def get_seq_length(self, layer_idx: int | None = 0) -> int:
        return self.seen_tokens

    def update(self, state: Any, new_tokens: int) -> None:
        self.state = state
        self.seen_tokens += int(new_tokens)

    def tensors(self) -> Iterator[tuple[str, torch.Tensor]]:
        """Every tensor of the state with its path, e.g. ``blocks.0.memory.W``."""

        def walk(node: Any, path: str):
            if isinstance(node, torch.Tensor):
                yield path, node
            elif isinstance(node, dict):
                for key, value in node.items():
                    yield from walk(value, f"{path}.{key}" if path else str(key))
            elif isinstance(node, (list, tuple)):
                for i, value in enumerate(node):
                    yield from walk(value, f"{path}.{i}" if path else str(i))

        yield from walk(self.state, "")

    def nbytes(self) -> int:
        seen, total = set(), 0
        for _, t in self.tensors():
            if id(t) not in seen:
                seen.add(id(t))
                total += t.numel() * t.element_size()
        return total

    def crop(self, max_length: int) -> None:
        raise NotImplementedError("an atlas memory state cannot be rolled back to an earlier position")

    def reorder_cache(self, beam_idx: torch.Tensor) -> None:
        raise NotImplementedError("beam search is not supported: the memory state is not reordered")

    def __repr__(self) -> str:
        n = sum(1 for _ in self.tensors())
        return f"AtlasMemoryCache(seen_tokens={self.seen_tokens}, tensors={n}, bytes={self.nbytes()})"
