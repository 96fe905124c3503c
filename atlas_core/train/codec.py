"""Text <-> token ids for a trained checkpoint, without the training file.

A checkpoint of a ``text`` task records its mode and, in char mode, its vocabulary (the distinct
characters in id order), so prompts can be encoded and samples decoded anywhere:

- ``byte``: ids are the UTF-8 bytes (256 ids); decoding replaces invalid sequences with U+FFFD;
- ``char``: id ``i`` is ``vocab[i]``; a prompt character outside the vocabulary is an error that
  names it;
- ``bpe``: the subword tokenizer the model was trained with, kept whole (its ``tokenizer.json``
  text) in the checkpoint, so decoding needs no file from the training machine.

Synthetic tasks (mqar, copy, ...) have no text form: their prompts are token ids.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Mapping


@dataclass(frozen=True)
class TextCodec:
    mode: str  # "byte" | "char" | "bpe"
    vocab: tuple[str, ...] | None = None
    tokenizer_json: str | None = None  # bpe: the tokenizer's JSON text

    @classmethod
    def from_task_meta(cls, meta: Mapping[str, Any] | None) -> "TextCodec | None":
        """The codec of a checkpoint's ``meta["task"]``, or None for a task without text."""
        text = (meta or {}).get("text")
        if not text:
            return None
        # checked here: the entry comes from a file, and a bad one must be one clear error
        mode = text.get("mode") if isinstance(text, Mapping) else None
        vocab = text.get("vocab") if isinstance(text, Mapping) else None
        if mode == "bpe":
            tok = text.get("tokenizer")
            if not isinstance(tok, str) or not tok:
                raise ValueError("task.text of a bpe model must hold its tokenizer's JSON text "
                                 "(task.text.tokenizer)")
            return cls("bpe", None, tok)
        if mode not in ("byte", "char") or (mode == "char" and not (
                isinstance(vocab, list) and all(isinstance(c, str) and len(c) == 1 for c in vocab))):
            raise ValueError("task.text must be {mode = 'byte'} or {mode = 'char', vocab = [one "
                             "character per id]}")
        return cls(mode, tuple(vocab) if vocab is not None else None)

    @property
    def tokenizer(self):
        """The ``tokenizers.Tokenizer`` of a bpe codec (built once)."""
        cached = self.__dict__.get("_tok")
        if cached is None:
            from .tokenizer import tokenizer_from_json

            cached = tokenizer_from_json(self.tokenizer_json or "", "the checkpoint's tokenizer")
            object.__setattr__(self, "_tok", cached)
        return cached

    def encode(self, text: str) -> list[int]:
        if self.mode == "bpe":
            return list(self.tokenizer.encode(text, add_special_tokens=False).ids)
        if self.mode == "byte":
            return list(text.encode("utf-8"))
        index = {ch: i for i, ch in enumerate(self.vocab or ())}
        missing = sorted({ch for ch in text if ch not in index})
        if missing:
            raise ValueError(
                f"--prompt: characters {''.join(missing)!r} are not in the model's character "
                f"vocabulary ({len(index)} characters of its training text); remove them"
            )
        return [index[ch] for ch in text]

    def decode(self, ids: list[int]) -> str:
        if self.mode == "bpe":
            size = self.tokenizer.get_vocab_size()
            return self.tokenizer.decode([i for i in ids if 0 <= i < size], skip_special_tokens=False)
        if self.mode == "byte":
            return bytes(i for i in ids if 0 <= i < 256).decode("utf-8", errors="replace")
        vocab = self.vocab or ()
        return "".join(vocab[i] if 0 <= i < len(vocab) else "\ufffd" for i in ids)
