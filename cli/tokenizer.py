"""``atlas tokenizer train|export``: subword tokenizers for the text task.

``train`` learns a byte-level BPE tokenizer on a local corpus (plain text, JSON Lines or Parquet)
and writes its ``tokenizer.json``; a text task uses it with ``mode = "bpe"`` and
``tokenizer = "tokenizer.json"``. ``export`` writes the tokenizer a checkpoint was trained with
(kept inside the checkpoint) back to a file.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any

import typer

from .common import AtlasTyper, FormatOption, emit, examples, log

app = AtlasTyper(help="Subword tokenizers for the text task (train on a corpus, export from a "
                  "checkpoint).", no_args_is_help=True)


def _write_new(out: Path, text: str, force: bool) -> None:
    """Write ``text`` to ``out`` through a temporary file and a rename (never half a file)."""
    if out.exists() and not force:
        raise FileExistsError(f"{out} exists; pass --force to replace it or choose another --out")
    if out.parent and not out.parent.exists():
        raise FileNotFoundError(f"--out {out}: the directory {out.parent} does not exist")
    tmp = out.with_name(f".{out.name}.partial")
    tmp.write_text(text, encoding="utf-8")
    tmp.replace(out)


@app.command("train", epilog=examples(
    "atlas tokenizer train corpus.jsonl --vocab-size 4096 --out tokenizer.json",
    "atlas tokenizer train book.txt --vocab-size 1024 --out book-tokenizer.json",
))
def train(
    corpus: Annotated[list[str], typer.Argument(help="corpus files (.txt, .jsonl/.json, .parquet)")],
    out: Annotated[str, typer.Option("--out", help="the tokenizer.json to write")] = "tokenizer.json",
    vocab_size: Annotated[int, typer.Option("--vocab-size", help="ids in the vocabulary (>= 260)")] = 4096,
    text_field: Annotated[str, typer.Option("--text-field", help="jsonl/parquet: the field that holds the text")] = "text",
    corpus_format: Annotated[str, typer.Option("--corpus-format", help="auto, text, jsonl or parquet")] = "auto",
    min_frequency: Annotated[int, typer.Option("--min-frequency", min=1, help="merge pairs seen at least this often")] = 2,
    force: Annotated[bool, typer.Option("--force", help="replace --out if it exists")] = False,
    fmt: FormatOption = None,
) -> None:
    """Learn a byte-level BPE tokenizer on local corpus files and write its tokenizer.json."""
    from atlas_core.train.tasks.corpus import FORMATS, read_documents
    from atlas_core.train.tokenizer import EOT, train_bpe

    if corpus_format not in FORMATS:
        raise typer.BadParameter(f"--corpus-format {corpus_format!r}: choose one of {', '.join(FORMATS)}")
    target = Path(out)
    if target.exists() and not force:  # before the work, not after
        raise FileExistsError(f"{target} exists; pass --force to replace it or choose another --out")
    docs: list[str] = []
    for path in corpus:
        docs += read_documents(path, corpus_format, text_field, path)
    log(f"tokenizer: learning {vocab_size} ids from {len(docs)} documents "
        f"({sum(len(d) for d in docs):,} characters)")
    tok = train_bpe(docs, vocab_size, min_frequency=min_frequency)
    _write_new(target, tok.to_str(), force)
    result: dict[str, Any] = {"tokenizer": str(target), "vocab_size": tok.get_vocab_size(),
                              "documents": len(docs), "end_of_text": EOT}
    emit(result, fmt, lambda r: log(
        f"tokenizer: wrote {r['tokenizer']} ({r['vocab_size']} ids, end-of-text {r['end_of_text']!r}); "
        f"use it with [train.task] mode = \"bpe\", tokenizer = \"{r['tokenizer']}\""))


@app.command("export", epilog=examples("atlas tokenizer export runs/corpus tokenizer.json"))
def export(
    checkpoint: Annotated[str, typer.Argument(help="a checkpoint directory or a run directory")],
    out: Annotated[str, typer.Argument(help="the tokenizer.json to write")],
    force: Annotated[bool, typer.Option("--force", help="replace OUT if it exists")] = False,
    fmt: FormatOption = None,
) -> None:
    """Write the tokenizer a bpe text model was trained with (kept in its checkpoint) to a file."""
    from atlas_core.train.checkpoint import load_checkpoint

    ckpt = load_checkpoint(checkpoint)
    codec = ckpt.meta.codec()
    if codec is None or codec.mode != "bpe":
        mode = "no text" if codec is None else f"{codec.mode} tokens"
        raise ValueError(f"{checkpoint}: this model was trained on {mode}, not with a subword "
                         "tokenizer (text task, mode = 'bpe'); there is no tokenizer to export")
    _write_new(Path(out), codec.tokenizer_json or "", force)
    emit({"tokenizer": out, "checkpoint": str(ckpt.path)}, fmt,
         lambda r: log(f"tokenizer: wrote {r['tokenizer']} (from {r['checkpoint']})"))


def register(root: typer.Typer) -> None:
    root.add_typer(app, name="tokenizer")
