"""Subword tokenizers for the text task, through Hugging Face ``tokenizers`` (optional extra
``data``).

- `train_bpe`: a byte-level BPE tokenizer learned locally from a corpus (plain text, JSON Lines
  or Parquet, read by `atlas_core.train.tasks.corpus`), with the end-of-text token ``EOT`` as a
  special token (id 0): documents are separated by it when a corpus is tokenised. This is what
  ``atlas tokenizer train`` runs.
- `load_tokenizer`: a ``tokenizer.json`` file or a Hugging Face tokenizer directory (one that
  holds a ``tokenizer.json``), as the text task's ``tokenizer`` param names it.

A trained model keeps its tokenizer: the text task records the tokenizer's JSON in the
checkpoint's ``meta.json`` (`atlas_core.train.codec.TextCodec`), so ``atlas generate`` decodes
without the original file.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Iterable, Sequence

from .errors import TokenizerError  # noqa: F401  (raised here; importable from here)

EOT = "<|endoftext|>"
MIN_VOCAB = 260  # the 256 byte symbols of byte-level BPE, the special token and a few merges
MAX_VOCAB = 1 << 20
_INSTALL = "pip install 'atlas-ttm[data]' (tokenizers and datasets)"


def _tokenizers():
    try:
        import tokenizers
    except ImportError:
        raise TokenizerError(f"subword tokenizers need the 'tokenizers' package: {_INSTALL}") from None
    return tokenizers


def train_bpe(texts: Iterable[str], vocab_size: int, *, min_frequency: int = 2) -> Any:
    """A byte-level BPE ``tokenizers.Tokenizer`` of ``vocab_size`` ids learned from ``texts``
    (one document per item). Id 0 is `EOT`."""
    if isinstance(vocab_size, bool) or not isinstance(vocab_size, int) or not (
            MIN_VOCAB <= vocab_size <= MAX_VOCAB):
        raise TokenizerError(
            f"vocab_size = {vocab_size!r}: must be a whole number in [{MIN_VOCAB}, {MAX_VOCAB}] "
            f"(byte-level BPE starts from 256 byte symbols); e.g. 4096")
    tk = _tokenizers()
    from tokenizers import decoders, models, pre_tokenizers, trainers

    tok = tk.Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size, min_frequency=min_frequency, special_tokens=[EOT],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False)
    count = [0]

    def counted():
        for text in texts:
            count[0] += 1
            yield text

    tok.train_from_iterator(counted(), trainer=trainer)
    if count[0] == 0:
        raise TokenizerError("the corpus has no documents: give a file with some text in it")
    return tok


def load_tokenizer(path: str | Path, shown: str | None = None) -> Any:
    """A ``tokenizers.Tokenizer`` from a ``tokenizer.json`` file or a directory holding one (a
    Hugging Face tokenizer directory saved by ``save_pretrained``)."""
    shown = shown or str(path)
    p = Path(path).expanduser()
    if p.is_dir():
        p = p / "tokenizer.json"
        if not p.is_file():
            raise TokenizerError(
                f"tokenizer {shown!r} is a directory without a tokenizer.json; give a "
                "tokenizer.json file or a Hugging Face tokenizer directory saved with "
                "save_pretrained (a fast tokenizer)")
    elif not p.is_file():
        raise TokenizerError(f"tokenizer {shown!r}: no such file; train one with "
                             "`atlas tokenizer train CORPUS --out tokenizer.json`")
    from ..safe_files import METADATA_FILE_LIMIT, FileRefusedError, read_bounded_text

    try:
        text = read_bounded_text(p, METADATA_FILE_LIMIT, fix="give a tokenizer.json file")
    except FileRefusedError as exc:
        raise TokenizerError(f"tokenizer {shown!r}: {exc.problem}; {exc.fix}") from None
    return tokenizer_from_json(text, shown)


def tokenizer_from_json(text: str, shown: str = "the tokenizer") -> Any:
    tk = _tokenizers()
    try:
        return tk.Tokenizer.from_str(text)
    except Exception as exc:  # the library raises plain Exceptions for malformed JSON
        first = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        raise TokenizerError(f"{shown} is not a tokenizers JSON file ({first})") from None


def eot_id(tok: Any, shown: str = "the tokenizer") -> int:
    """The id of the end-of-text token; a tokenizer without one cannot separate documents."""
    for name in (EOT, "</s>", "<eos>", "[SEP]"):
        i = tok.token_to_id(name)
        if i is not None:
            return int(i)
    raise TokenizerError(
        f"{shown} has no end-of-text token ({EOT!r}, '</s>', '<eos>' or '[SEP]'), which the text "
        "task puts between documents; train one with `atlas tokenizer train`")


def encode_documents(tok: Any, docs: Sequence[str]) -> list[int]:
    """The ids of every document, each followed by the end-of-text id."""
    eot = eot_id(tok)
    out: list[int] = []
    for enc in tok.encode_batch(list(docs), add_special_tokens=False):
        out.extend(enc.ids)
        out.append(eot)
    return out
