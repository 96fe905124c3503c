"""Reading and writing spec TOML.

Reading uses the standard library's ``tomllib``; a syntax error becomes a `SpecFileError` that
names the file, the line and the column. ``tomllib`` cannot write, so `dumps` is a small writer
for the values a resolved spec holds:

- top-level scalars first, then one ``[table]`` per top-level mapping, in insertion order;
- inside a table, nested mappings are written as inline tables (``x = { use = "core:l2" }``),
  which keeps a knob and its params on one line;
- strings, booleans, integers, floats (``inf``/``nan`` included), lists, dates and times;
- ``None`` has no TOML spelling: a key whose value is None is left out (a table's own keys are
  written as a comment, ``# d_key is not set``). Resolution fills those
  defaults again, so ``load_spec(spec.to_toml()) == spec`` still holds. A None inside a list
  cannot be left out and is an error.

The writer is tested by round trip (``tomllib.loads(dumps(x)) == x`` without Nones).
"""

from __future__ import annotations

import datetime as _dt
import math
import re
import tomllib
from pathlib import Path
from typing import Any, Mapping

from ..errors import Issue, SpecError

_BARE_KEY = re.compile(r"[A-Za-z0-9_-]+")
_LOCATION = re.compile(r"\s*\(at line (\d+), column (\d+)\)\s*$")


class SpecFileError(SpecError):
    """A spec file that cannot be read: missing, unreadable or not valid TOML.

    Rendered as ``file:line:column: message`` (line and column when known)."""

    def __init__(self, file: str, message: str, line: int | None = None,
                 column: int | None = None, hint: str | None = None) -> None:
        self.file, self.message, self.line, self.column, self.hint = file, message, line, column, hint
        super().__init__([Issue("", message, None, hint)], source=file)

    def _render(self) -> str:
        where = self.file
        if self.line is not None:
            where += f":{self.line}"
            if self.column is not None:
                where += f":{self.column}"
        text = f"{where}: {self.message}"
        return text + (f"; {self.hint}" if self.hint else "")


# -- reading ----------------------------------------------------------------------------------
def loads(text: str, source: str = "<string>") -> dict[str, Any]:
    """Parse TOML text; a syntax error is a `SpecFileError` with line and column."""
    try:
        return tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        msg = str(exc)
        line = column = None
        m = _LOCATION.search(msg)
        if m:
            line, column = int(m.group(1)), int(m.group(2))
            msg = msg[: m.start()]
        msg = msg.replace(" (at end of document)", " at the end of the document")
        raise SpecFileError(source, f"invalid TOML: {msg}", line, column) from None


def load_file(path: str | Path) -> dict[str, Any]:
    """Read and parse a TOML file, with errors that name the file.

    The file must be a regular file of at most `SPEC_FILE_LIMIT` bytes (1 MiB), read with
    bounded memory: a device, a FIFO or a huge file is one error, not a hang (`safe_files`)."""
    from ..safe_files import SPEC_FILE_LIMIT, FileRefusedError, read_bounded_text

    p = Path(path)
    if not p.exists():
        raise SpecFileError(str(p), "no such file", hint="check the path")
    if p.is_dir():
        raise SpecFileError(str(p), "is a directory, not a spec file", hint="pass a .toml file")
    try:
        text = read_bounded_text(p, SPEC_FILE_LIMIT, fix="pass a spec file (.toml, at most 1 MiB)")
    except FileRefusedError as exc:
        raise SpecFileError(exc.path, exc.problem, hint=exc.fix) from None
    return loads(text, str(p))


# -- writing ----------------------------------------------------------------------------------
def _key(key: Any) -> str:
    if not isinstance(key, str):
        raise TypeError(f"TOML keys must be strings, got {key!r}")
    # fullmatch: `$` would also match before a final newline, and "a\n" is no bare key
    return key if _BARE_KEY.fullmatch(key) else _string(key)


def _string(s: str) -> str:
    out = []
    for ch in s:
        if ch == "\\":
            out.append("\\\\")
        elif ch == '"':
            out.append('\\"')
        elif ch == "\n":
            out.append("\\n")
        elif ch == "\t":
            out.append("\\t")
        elif ch == "\r":
            out.append("\\r")
        elif ord(ch) < 0x20 or ord(ch) == 0x7F:
            out.append(f"\\u{ord(ch):04x}")
        else:
            out.append(ch)
    return '"' + "".join(out) + '"'


def _float(x: float) -> str:
    if math.isnan(x):
        return "nan"
    if math.isinf(x):
        return "inf" if x > 0 else "-inf"
    text = repr(x)  # shortest text that reads back to the same float
    if "." not in text and "e" not in text and "E" not in text:
        text += ".0"
    return text


def _value(v: Any, where: str) -> str:
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, int):
        return str(v)
    if isinstance(v, float):
        return _float(v)
    if isinstance(v, str):
        return _string(v)
    if isinstance(v, (_dt.datetime, _dt.date, _dt.time)):
        return v.isoformat()
    if isinstance(v, Mapping):
        items = [f"{_key(k)} = {_value(x, f'{where}.{k}')}" for k, x in v.items() if x is not None]
        return "{ " + ", ".join(items) + " }" if items else "{}"
    if isinstance(v, (list, tuple)):
        for i, x in enumerate(v):
            if x is None:
                raise TypeError(f"{where}[{i}]: None cannot be written in TOML")
        return "[" + ", ".join(_value(x, f"{where}[{i}]") for i, x in enumerate(v)) + "]"
    raise TypeError(f"{where}: cannot write {type(v).__name__} {v!r} as TOML")


def dumps(data: Mapping[str, Any]) -> str:
    """Write a mapping as TOML (see the module docstring for the layout)."""
    lines: list[str] = []
    tables = []
    for k, v in data.items():
        if v is None:
            continue
        if isinstance(v, Mapping):
            tables.append((k, v))
        else:
            lines.append(f"{_key(k)} = {_value(v, k)}")
    for name, table in tables:
        if lines:
            lines.append("")
        lines.append(f"[{_key(name)}]")
        for k, v in table.items():
            if v is None:  # no TOML spelling: say so in a comment (reads back as the default)
                lines.append(f"# {_key(k)} is not set")
            else:
                lines.append(f"{_key(k)} = {_value(v, f'{name}.{k}')}")
    return "\n".join(lines) + "\n"
