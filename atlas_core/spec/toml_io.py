"""Reading and writing spec TOML.

Reading uses the standard library's ``tomllib``; a syntax error becomes a `SpecFileError` that
names the file, the line and the column. Tables and arrays nested deeper than `MAX_NESTING` (64)
and NUL characters are refused before parsing, and any other parser failure is a `SpecFileError`
too (never a traceback). Writing uses ``tomli_w``: top-level scalars first, then
one ``[table]`` per mapping (nested mappings become ``[a.b]`` sub-tables). ``None`` has no TOML
spelling: a key whose value is None is left out, and resolution fills that default again, so
``load_spec(spec.to_toml()) == spec`` still holds; a None inside a list cannot be left out and is
a TypeError naming its place.
"""

from __future__ import annotations

import datetime as _dt
import re
import tomllib
from pathlib import Path
from typing import Any, Mapping

from ..errors import Issue, SpecError

_LOCATION = re.compile(r"\s*\(at line (\d+), column (\d+)\)\s*$")
# strings (multi-line and literal, possibly unterminated), comments, brackets, and runs of the rest
_TOKENS = re.compile(r'''"""(?:[^\\]|\\.)*?"""|\'\'\'.*?\'\'\'|"[^"\\\n]*(?:\\.[^"\\\n]*)*"?|\'[^\'\n]*\'?'''
                     r"|#[^\n]*|[{}\[\]]|[^{}\[\]#\"']+", re.S)


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
#: Deepest nesting of tables and arrays a spec may use (a resolved spec nests three levels:
#: ``[memory]`` -> ``algorithm`` -> a knob's params); deeper input is refused before parsing.
MAX_NESTING = 64


def _nesting_depth(text: str) -> int:
    """The deepest nesting of ``{`` / ``[`` brackets outside strings and comments: an upper bound
    of the nesting the parser would recurse into (a table header counts one level)."""
    depth = deepest = 0
    for m in _TOKENS.finditer(text):
        ch = m.group()
        if ch in ("{", "["):
            depth += 1
            deepest = max(deepest, depth)
        elif ch in ("}", "]"):
            depth = max(0, depth - 1)
    return deepest


def loads(text: str, source: str = "<string>") -> dict[str, Any]:
    """Parse TOML text; a syntax error is a `SpecFileError` with line and column.

    Input nested deeper than `MAX_NESTING` is refused before parsing (the parser recurses once
    per level), and a parser failure of any other kind is a `SpecFileError` too, never a
    traceback."""
    if not isinstance(text, str):
        raise SpecFileError(source, f"expected TOML text, got {type(text).__name__}")
    if "\x00" in text:
        at = text.index("\x00")
        line = text.count("\n", 0, at) + 1
        raise SpecFileError(source, "invalid TOML: a NUL character", line,
                            at - (text.rfind("\n", 0, at) + 1) + 1, "a spec is plain text")
    deepest = _nesting_depth(text)
    if deepest > MAX_NESTING:
        raise SpecFileError(source, f"tables or arrays nested {deepest} deep (limit {MAX_NESTING})",
                            hint="a spec nests a few levels; flatten the value")
    try:
        return tomllib.loads(text)
    except RecursionError:
        raise SpecFileError(source, f"tables or arrays nested too deep (limit {MAX_NESTING})",
                            hint="a spec nests a few levels; flatten the value") from None
    except (ValueError, TypeError, OverflowError, MemoryError) as exc:
        if isinstance(exc, tomllib.TOMLDecodeError):
            raise _syntax_error(exc, source) from None
        raise SpecFileError(source, f"invalid TOML: {type(exc).__name__}: {exc}") from None


def _syntax_error(exc: tomllib.TOMLDecodeError, source: str) -> SpecFileError:
    msg = str(exc)
    line = column = None
    m = _LOCATION.search(msg)
    if m:
        line, column = int(m.group(1)), int(m.group(2))
        msg = msg[: m.start()]
    msg = msg.replace(" (at end of document)", " at the end of the document")
    return SpecFileError(source, f"invalid TOML: {msg}", line, column)


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
def _clean(v: Any, where: str) -> Any:
    """``v`` with None values of mappings left out (TOML has no null); a None inside a list,
    or a value TOML cannot hold, is a TypeError naming where it is."""
    if isinstance(v, Mapping):
        out = {}
        for k, x in v.items():
            if not isinstance(k, str):
                raise TypeError(f"{where}: TOML keys must be strings, got {k!r}")
            if x is not None:
                out[k] = _clean(x, f"{where}.{k}" if where else k)
        return out
    if isinstance(v, (list, tuple)):
        for i, x in enumerate(v):
            if x is None:
                raise TypeError(f"{where}[{i}]: None cannot be written in TOML")
        return [_clean(x, f"{where}[{i}]") for i, x in enumerate(v)]
    if isinstance(v, (bool, int, float, str, _dt.datetime, _dt.date, _dt.time)):
        return v
    raise TypeError(f"{where}: cannot write {type(v).__name__} {v!r} as TOML")


def dumps(data: Mapping[str, Any]) -> str:
    """Write a mapping as TOML with ``tomli_w`` (see the module docstring)."""
    import tomli_w

    return tomli_w.dumps(_clean(data, ""))
