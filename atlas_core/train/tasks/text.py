"""Language modelling on a local corpus the user names: bytes, characters or subword tokens.

The corpus (``path``) is a plain text file (one document), a JSON Lines file or a Parquet file
(one document per row, in field ``text_field``); ``format = "auto"`` picks by extension, and the
tables are read through ``datasets`` (`corpus.read_documents`). Tokens:

- ``mode = "byte"``: the raw bytes are the tokens, ``vocab_size = 256``; any file works;
- ``mode = "char"``: the text is decoded (``encoding``, UTF-8 by default) and every distinct
  character becomes one token, ids in code-point order, ``vocab_size`` = the number of distinct
  characters. `vocab` lists them, for decoding and for saving beside a checkpoint;
- ``mode = "bpe"``: a subword tokenizer (``tokenizer``: a ``tokenizer.json`` or a Hugging Face
  tokenizer directory, e.g. one trained by ``atlas tokenizer train``); ``vocab_size`` is the
  tokenizer's. Every document ends with the end-of-text token, so documents stay separated.

In byte and char mode the documents of a table are joined with a blank line between them.

A batch is B windows of T + 1 consecutive tokens at uniform random offsets: ``inputs`` the first
T, ``targets`` the last T (plain next-token prediction, every position counts).

Packed documents (``[train] pack = true``): `packed_batch` draws the same windows and also says
where each document starts inside a row (``starts: BoolTensor [B, T]``, True at position 0 and at
the first token of every document); a target that is the first token of a document is
``IGNORE_INDEX`` (nothing predicts a document from the one before it). Documents are the rows of
a table (in byte and char mode each ends with its blank-line separator; in bpe mode with its
end-of-text token); a plain text file is one document.

Held-out text: the last ``val_fraction`` of the tokens is the ``"val"`` split, the rest the
``"train"`` split (the default), ``"all"`` is the whole file. Training on ``train`` and evaluating
on ``val`` (``task.derive(split="val")``) keeps the perplexity honest.

Tensors: ``inputs, targets: LongTensor [B, T]``.
"""

from __future__ import annotations

from pathlib import Path
from typing import Literal

import torch
from pydantic import Field, ValidationInfo, field_validator, model_validator
from ...params import size_field

from ...host.registry import Params
from .base import IGNORE_INDEX, Task, TaskDataError, TaskFileNotFoundError
from .corpus import corpus_format, read_documents


class TextParams(Params):
    # reads_file: a checkpoint's value is never reused without the user naming it (`file_params`)
    path: str = Field(..., min_length=1, description="the text file (relative to the cwd)",
                      json_schema_extra={"reads_file": True})
    mode: Literal["byte", "char", "bpe"] = Field(
        "byte", description="byte (256 ids), char (one id per distinct character) or bpe "
        "(the subword tokenizer named by `tokenizer`; the default when a tokenizer is given)")
    tokenizer: str | None = Field(
        None, min_length=1, description="bpe mode: a tokenizer.json or a Hugging Face tokenizer "
        "directory (`atlas tokenizer train` makes one)", json_schema_extra={"reads_file": True})
    format: Literal["auto", "text", "jsonl", "parquet"] = Field(
        "auto", description="corpus format; auto: .jsonl/.json -> jsonl, .parquet -> parquet, "
        "else text (one document)")
    text_field: str = Field("text", min_length=1,
                            description="jsonl/parquet: the field that holds each document")
    seq_len: int = size_field(256, "seq_len", ge=1, description="T, tokens per window")
    split: Literal["train", "val", "all"] = Field("train", description="which part of the file")
    val_fraction: float = Field(0.1, ge=0.0, lt=1.0, description="share of the file held out")
    encoding: str = Field("utf-8", min_length=1, description="text encoding in char mode")

    @field_validator("val_fraction")
    @classmethod
    def _val_exists(cls, fraction: float, info: ValidationInfo) -> float:
        if info.data.get("split") == "val" and fraction == 0.0:
            raise ValueError(
                "val_fraction=0.0 leaves no held-out text for split='val'; set val_fraction "
                "> 0 (e.g. 0.1) or use split='train' or 'all'"
            )
        return fraction

    @model_validator(mode="before")
    @classmethod
    def _tokenizer_means_bpe(cls, data):
        """A tokenizer without a mode means ``mode = "bpe"``."""
        if isinstance(data, dict) and data.get("tokenizer") is not None and "mode" not in data:
            return {**data, "mode": "bpe"}
        return data

    @model_validator(mode="after")
    def _tokenizer_with_bpe(self) -> "TextParams":
        if self.mode == "bpe" and self.tokenizer is None:
            raise ValueError("mode = 'bpe' needs a tokenizer: a tokenizer.json file or a Hugging "
                             "Face tokenizer directory (`atlas tokenizer train CORPUS --out "
                             "tokenizer.json` makes one)")
        if self.mode != "bpe" and self.tokenizer is not None:
            raise ValueError(f"a tokenizer is used only with mode = 'bpe' (mode is {self.mode!r}); "
                             "set mode = 'bpe' or leave the tokenizer out")
        return self


class TextTask(Task):
    """Next-token prediction on random windows of a text file; see the module docstring."""

    name = "text"
    Params = TextParams
    packs_documents = True

    def __init__(self, params=None, ctx=None):
        super().__init__(params, ctx)
        p = self.params
        self.path = Path(p.path).expanduser()
        self.vocab: list[str] | None = None
        self.tokenizer = None
        fmt = corpus_format(self.path, p.format)
        if p.mode == "bpe":
            from ..tokenizer import encode_documents, eot_id, load_tokenizer

            self.tokenizer = load_tokenizer(p.tokenizer)
            docs = read_documents(self.path, fmt, p.text_field, p.path)
            tokens = torch.tensor(encode_documents(self.tokenizer, docs), dtype=torch.int32)
            first = torch.zeros(tokens.numel(), dtype=torch.bool)
            first[0] = True  # a document starts after each end-of-text token
            first[1:] = tokens[:-1] == eot_id(self.tokenizer)
        else:
            if fmt == "text":
                raw = _read(self.path, p.path)
                lengths = None
            else:
                docs = read_documents(self.path, fmt, p.text_field, p.path)
                raw = "\n\n".join(docs).encode(p.encoding if p.mode == "char" else "utf-8")
                # each document's tokens and its "\n\n" separator (the last has none)
                lengths = [(len(d) if p.mode == "char" else len(d.encode("utf-8"))) + 2 for d in docs]
            if p.mode == "byte":
                tokens = torch.frombuffer(bytearray(raw), dtype=torch.uint8)
            else:
                tokens, self.vocab = _chars(raw, p.encoding, p.path)
            first = torch.zeros(tokens.numel(), dtype=torch.bool)
            ends = torch.tensor(lengths or [], dtype=torch.long).cumsum(0)
            first[0] = True
            first[ends[ends < tokens.numel()]] = True
        self.file_tokens = tokens.numel()
        held_out = int(self.file_tokens * p.val_fraction)
        cut = self.file_tokens - held_out
        self.tokens = {"train": tokens[:cut], "val": tokens[cut:], "all": tokens}[p.split]
        #: True at the first token of every document (`packed_batch`)
        self.first = {"train": first[:cut], "val": first[cut:], "all": first}[p.split]
        unit = {"byte": "byte", "char": "character", "bpe": "token"}[p.mode]
        have = self.tokens.numel()
        if have < p.seq_len + 1:
            where = "" if p.split == "all" else (
                f" in the {p.split} split (val_fraction={p.val_fraction}) of"
            )
            fix = f"lower seq_len to <= {have - 1}" if have >= 2 else "use a longer file"
            raise TaskDataError(
                f"text task: seq_len={p.seq_len} needs at least seq_len + 1 = {p.seq_len + 1} "
                f"{unit}s{where or ' in'} {p.path!r}, which has {have} (the file has "
                f"{self.file_tokens}); {fix}"
            )
        self._index = {ch: i for i, ch in enumerate(self.vocab)} if self.vocab else None

    @property
    def vocab_size(self) -> int:
        if self.tokenizer is not None:
            return int(self.tokenizer.get_vocab_size())
        return 256 if self.vocab is None else len(self.vocab)

    def _sample(self, batch_size, generator):
        T = self.params.seq_len
        starts = torch.randint(0, self.tokens.numel() - T, (batch_size, 1), generator=generator)
        windows = self.tokens[starts + torch.arange(T + 1)].long()  # [B, T + 1]
        return windows[:, :-1].clone(), windows[:, 1:].clone()

    def packed_batch(self, batch_size: int, generator: torch.Generator | None = None):
        """The windows of `batch` (same draws) as packed documents: ``(inputs, targets, starts)``,
        each ``[B, T]``; ``starts`` is True where a document begins in the row (always at 0),
        and a target that begins a document is ``IGNORE_INDEX``."""
        T = self.params.seq_len
        if isinstance(batch_size, bool) or not isinstance(batch_size, int) or batch_size < 1:
            raise ValueError(f"batch_size must be a positive int (got {batch_size!r})")
        starts = torch.randint(0, self.tokens.numel() - T, (batch_size, 1), generator=generator)
        at = starts + torch.arange(T + 1)
        windows, first = self.tokens[at].long(), self.first[at]
        targets = windows[:, 1:].clone()
        targets[first[:, 1:]] = IGNORE_INDEX
        begins = first[:, :-1].clone()
        begins[:, 0] = True
        return windows[:, :-1].clone(), targets, begins

    # -- text <-> ids, for prompts and generated samples -----------------------------------------
    def encode(self, text: str) -> torch.Tensor:
        """``[L]`` int64 ids of ``text`` (UTF-8 bytes in byte mode)."""
        if self.tokenizer is not None:
            return torch.tensor(self.tokenizer.encode(text, add_special_tokens=False).ids,
                                dtype=torch.long)
        if self._index is None:
            return torch.tensor(list(text.encode("utf-8")), dtype=torch.long)
        missing = sorted({ch for ch in text if ch not in self._index})
        if missing:
            raise ValueError(
                f"text: characters {''.join(missing)!r} do not occur in {self.params.path!r}, "
                "so they have no id in char mode; remove them or use mode='byte'"
            )
        return torch.tensor([self._index[ch] for ch in text], dtype=torch.long)

    def decode(self, ids: torch.Tensor | list[int]) -> str:
        """The text of ``ids`` (bytes that are not valid UTF-8 become U+FFFD in byte mode)."""
        ids = ids.tolist() if isinstance(ids, torch.Tensor) else list(ids)
        if self.tokenizer is not None:
            return self.tokenizer.decode(ids, skip_special_tokens=False)
        if self.vocab is None:
            return bytes(ids).decode("utf-8", errors="replace")
        return "".join(self.vocab[i] for i in ids)


def _read(path: Path, shown: str) -> bytes:
    if not path.exists():
        raise TaskFileNotFoundError(
            f"text task: no such file {shown!r} (task param 'path', resolved to "
            f"{str(path.absolute())!r}); give the path of an existing text file"
        )
    if not path.is_file():
        raise TaskDataError(f"text task: {shown!r} is not a file; give the path of a text file")
    raw = path.read_bytes()
    if not raw:
        raise TaskDataError(f"text task: {shown!r} is empty; give a file with some text in it")
    return raw


def _chars(raw: bytes, encoding: str, shown: str) -> tuple[torch.Tensor, list[str]]:
    """Character ids (int32, code-point order) and the vocabulary of the decoded text."""
    try:
        text = raw.decode(encoding)
    except LookupError:
        raise TaskDataError(
            f"text task: unknown encoding {encoding!r}; use a Python codec name such as 'utf-8'"
        ) from None
    except UnicodeDecodeError as exc:
        raise TaskDataError(
            f"text task: {shown!r} is not valid {encoding} (byte {exc.start}: {exc.reason}); "
            "set 'encoding' to the file's encoding or use mode='byte'"
        ) from None
    if not text:
        raise TaskDataError(f"text task: {shown!r} decodes to no characters; give a text file")
    # UTF-32 gives one int32 code point per character; unique sorts them and numbers them.
    points = torch.frombuffer(bytearray(text.encode("utf-32-le")), dtype=torch.int32)
    uniq, ids = torch.unique(points, sorted=True, return_inverse=True)
    return ids.to(torch.int32), [chr(c) for c in uniq.tolist()]
