"""Local corpora as lists of documents, read through Hugging Face ``datasets`` (optional extra
``data``).

Formats (``format = "auto"`` picks by the file's extension):

- ``"text"`` (``.txt`` and anything else): the whole file is one document;
- ``"jsonl"`` (``.jsonl``, ``.json``): one JSON object per line, the document is the string in
  field ``text_field``;
- ``"parquet"`` (``.parquet``): one row per document, column ``text_field``.

Nothing is downloaded: ``datasets`` reads the local file into its cache (``HF_DATASETS_CACHE``,
by default under ``~/.cache/huggingface``), offline.
"""

from __future__ import annotations

import os
from pathlib import Path

from .base import TaskDataError, TaskFileNotFoundError

FORMATS = ("auto", "text", "jsonl", "parquet")
_BUILDER = {"jsonl": "json", "parquet": "parquet"}
_INSTALL = "pip install 'atlas-ttm[data]' (datasets and tokenizers)"


def corpus_format(path: str | Path, fmt: str = "auto") -> str:
    """The format of ``path``: ``fmt`` itself, or for ``"auto"`` the one its extension names."""
    if fmt != "auto":
        return fmt
    suffix = Path(path).suffix.lower()
    if suffix in (".jsonl", ".json"):
        return "jsonl"
    if suffix == ".parquet":
        return "parquet"
    return "text"


def read_documents(path: str | Path, fmt: str = "auto", text_field: str = "text",
                   shown: str | None = None) -> list[str]:
    """The documents of a local corpus file (see the module docstring). Errors name the file,
    the field and the fix."""
    shown = shown or str(path)
    p = Path(path).expanduser()
    if not p.exists():
        raise TaskFileNotFoundError(
            f"text task: no such file {shown!r} (resolved to {str(p.absolute())!r}); give the "
            "path of an existing corpus file")
    if not p.is_file():
        raise TaskDataError(f"text task: {shown!r} is not a file; give the path of a corpus file")
    kind = corpus_format(p, fmt)
    if kind == "text":
        from ...safe_files import FileRefusedError, read_bounded

        try:
            raw = read_bounded(p, 1 << 34, fix="give a smaller text file")
        except FileRefusedError as exc:
            raise TaskDataError(f"text task: {shown!r}: {exc.problem}; {exc.fix}") from None
        try:
            text = raw.decode("utf-8")
        except UnicodeDecodeError as exc:
            raise TaskDataError(
                f"text task: {shown!r} is not valid UTF-8 (byte {exc.start}: {exc.reason}); "
                "convert it to UTF-8 or use mode = 'byte'") from None
        docs = [text] if text else []
    else:
        docs = _read_table(p, kind, text_field, shown)
    docs = [d for d in docs if d]
    if not docs:
        raise TaskDataError(f"text task: {shown!r} holds no text (no non-empty documents); give a "
                            "corpus with some text in it")
    return docs


def _read_table(p: Path, kind: str, text_field: str, shown: str) -> list[str]:
    os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
    try:
        import datasets
    except ImportError:
        raise TaskDataError(f"text task: reading {kind} corpora needs the 'datasets' package: "
                            f"{_INSTALL}") from None
    datasets.disable_progress_bars()
    try:
        ds = datasets.load_dataset(_BUILDER[kind], data_files=str(p.absolute()), split="train")
    except Exception as exc:  # the library raises many kinds for a malformed file
        first = (str(exc).splitlines() or [type(exc).__name__])[0][:300]
        raise TaskDataError(f"text task: {shown!r} cannot be read as {kind} ({first}); check the "
                            f"file or set format = 'text'") from None
    if text_field not in ds.column_names:
        raise TaskDataError(
            f"text task: {shown!r} has no field {text_field!r} (its fields: "
            f"{', '.join(ds.column_names) or 'none'}); set text_field to the field that holds "
            "the text")
    docs = ds[text_field]
    bad = next((i for i, d in enumerate(docs) if d is not None and not isinstance(d, str)), None)
    if bad is not None:
        raise TaskDataError(
            f"text task: {shown!r} row {bad}: field {text_field!r} holds "
            f"{type(docs[bad]).__name__}, not text; set text_field to a string field")
    return [d for d in docs if d]
