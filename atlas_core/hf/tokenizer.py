"""A text model's codec as a Hugging Face fast tokenizer, saved with every export, so that
``AutoTokenizer.from_pretrained(EXPORT)`` and the clients built on it (``pipeline``,
lm-evaluation-harness, TRL) turn text into the ids the model was trained on:

- ``byte``: byte-level, one token per UTF-8 byte, id = the byte (a ``tokenizers`` BPE with the 256
  byte symbols of the byte-level alphabet and no merges; decoding replaces invalid UTF-8 with
  U+FFFD, as ``atlas generate`` does);
- ``char``: one token per character of the training text, id = its index in the checkpoint's
  vocabulary (a word-level model over single characters); a character outside it is an error,
  as for ``atlas generate --prompt`` (there is no unknown-character id to map it to);
- ``bpe``: the training tokenizer itself, with its end-of-text token as ``eos_token``.

Byte and char tokenizers declare no special tokens: such a model separates documents by a
blank line (two tokens), not by one token, and a newline declared special would be dropped
from decoded text. Tools that need one id before a text (lm-evaluation-harness's rolling
log-likelihood) take it as an argument (``prefix_token_id``, see docs/huggingface.md).
"""

from __future__ import annotations

from typing import Any


def byte_symbols() -> list[str]:
    """The byte-level alphabet in byte order: ``byte_symbols()[b]`` stands for byte ``b`` (GPT-2's
    mapping, which ``tokenizers``' ByteLevel pre-tokenizer and decoder use)."""
    printable = (list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1))
                 + list(range(ord("®"), ord("ÿ") + 1)))
    symbols, extra = {}, 0
    for b in range(256):
        if b in printable:
            symbols[b] = chr(b)
        else:
            symbols[b] = chr(256 + extra)
            extra += 1
    return [symbols[b] for b in range(256)]


def backend_tokenizer(codec: Any):
    """The ``tokenizers.Tokenizer`` of a codec (see the module docstring)."""
    from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers

    if codec.mode == "bpe":
        return codec.tokenizer
    if codec.mode == "byte":
        vocab = {sym: b for b, sym in enumerate(byte_symbols())}
        tok = Tokenizer(models.BPE(vocab=vocab, merges=[]))
        tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
        tok.decoder = decoders.ByteLevel()
        return tok
    if codec.mode == "char":
        vocab = {ch: i for i, ch in enumerate(codec.vocab)}
        tok = Tokenizer(models.WordLevel(vocab=vocab, unk_token="<unk>"))
        # every character is a piece of its own (any character: "." would skip newlines)
        tok.pre_tokenizer = pre_tokenizers.Split(Regex(r"[\s\S]"), behavior="isolated")
        tok.decoder = decoders.Fuse()
        return tok
    raise ValueError(f"text codec mode {codec.mode!r} has no tokenizer (byte, char or bpe)")


def hf_tokenizer(codec: Any):
    """A ``transformers.PreTrainedTokenizerFast`` for ``codec`` (`backend_tokenizer`)."""
    from transformers import PreTrainedTokenizerFast

    tok = backend_tokenizer(codec)
    special: dict[str, str] = {}
    if codec.mode == "bpe":
        from ..train.tokenizer import EOT

        if tok.token_to_id(EOT) is not None:
            special["eos_token"] = EOT
    # no "clean-up" of decoded text (transformers' older default turns " ." into "."): the
    # text is the codec's, byte for byte
    return PreTrainedTokenizerFast(tokenizer_object=tok, clean_up_tokenization_spaces=False,
                                   **special)
