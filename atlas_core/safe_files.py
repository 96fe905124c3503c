"""Reading files that a user or another file names, with bounded time and memory.

A path can name something that is not a file to read: ``/dev/zero`` never ends, a FIFO blocks
the ``open`` until a writer comes, a directory cannot be read, and a sparse file can claim 10 GB
while costing no disk. Reading any of them whole (``Path.read_bytes``) hangs or exhausts memory
before a size could be compared with anything. `read_bounded` therefore:

- looks at the path with ``stat`` first and opens only a regular file (a device is never opened:
  opening one can have side effects);
- refuses a file larger than the caller's limit before reading a byte;
- checks the opened descriptor again (``fstat``: the path may have been replaced in between) and
  reads at most ``limit + 1`` bytes, so a file that grows while it is read is refused too.

Every refusal is one `FileRefusedError` naming the path, the problem and the fix; callers turn it
into their own error type (a spec file's `SpecFileError`, a checkpoint's `CheckpointError`).

Limits (documented in README.md and docs/training.md):

==========================  ==============  ===================================================
`SPEC_FILE_LIMIT`           1 MiB           a spec (``.toml``); the bundled ones are under 2 KiB
`METADATA_FILE_LIMIT`       16 MiB          a checkpoint's ``manifest.json``, ``meta.json``,
                                            ``spec.toml`` (a char vocabulary included)
==========================  ==============  ===================================================
"""

from __future__ import annotations

import os
import stat
from pathlib import Path

from .errors import AtlasError

SPEC_FILE_LIMIT = 1 << 20
METADATA_FILE_LIMIT = 16 << 20

_CHUNK = 1 << 20


class FileRefusedError(AtlasError, ValueError):
    """A path that is not a regular file within the size limit: ``path: problem; fix``."""

    def __init__(self, path: str, problem: str, fix: str) -> None:
        self.path, self.problem, self.fix = path, problem, fix
        super().__init__(f"{path}: {problem}; {fix}")


def format_size(n: int) -> str:
    """``1 MiB``, ``10 GiB``, ``512 bytes``: sizes in messages."""
    for unit, shift in (("GiB", 30), ("MiB", 20), ("KiB", 10)):
        if n >= 1 << shift:
            value = n / (1 << shift)
            return f"{value:.0f} {unit}" if value == int(value) else f"{value:.1f} {unit}"
    return f"{n} byte{'s' if n != 1 else ''}"


def _kind(mode: int) -> str:
    if stat.S_ISCHR(mode):
        return "a character device"
    if stat.S_ISBLK(mode):
        return "a block device"
    if stat.S_ISFIFO(mode):
        return "a named pipe (FIFO)"
    if stat.S_ISSOCK(mode):
        return "a socket"
    return "not a regular file"


def _check(path: str, st: os.stat_result, limit: int | None, fix: str) -> None:
    if stat.S_ISDIR(st.st_mode):
        raise FileRefusedError(path, "is a directory, not a file", fix)
    if not stat.S_ISREG(st.st_mode):
        raise FileRefusedError(path, f"is {_kind(st.st_mode)}, not a regular file", fix)
    if limit is not None and st.st_size > limit:
        raise FileRefusedError(
            path, f"is {format_size(st.st_size)}, over the {format_size(limit)} limit", fix)


def check_regular_file(path: str | os.PathLike, limit: int | None = None, *,
                       fix: str = "give the path of a regular file") -> os.stat_result:
    """``stat`` of ``path`` if it is a regular file of at most ``limit`` bytes (symlinks
    followed); otherwise `FileRefusedError`. Nothing is opened."""
    shown = str(path)
    try:
        st = os.stat(path)
    except FileNotFoundError:
        raise FileRefusedError(shown, "no such file", fix) from None
    except OSError as exc:
        raise FileRefusedError(shown, f"cannot be read ({exc.strerror or exc})", fix) from None
    _check(shown, st, limit, fix)
    return st


def read_bounded(path: str | os.PathLike, limit: int, *,
                 fix: str = "give the path of a regular file") -> bytes:
    """The bytes of the regular file ``path``, at most ``limit`` of them (see the module
    docstring); anything else is one `FileRefusedError`."""
    shown = str(path)
    check_regular_file(path, limit, fix=fix)
    # O_NONBLOCK: if the path became a FIFO after the stat, the open must not wait for a writer
    flags = os.O_RDONLY | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_CLOEXEC", 0)
    flags |= getattr(os, "O_BINARY", 0)
    try:
        fd = os.open(path, flags)
    except OSError as exc:
        raise FileRefusedError(shown, f"cannot be opened ({exc.strerror or exc})", fix) from None
    with os.fdopen(fd, "rb", buffering=0) as fh:
        _check(shown, os.fstat(fd), limit, fix)
        chunks: list[bytes] = []
        total = 0
        while total <= limit:
            try:
                chunk = fh.read(min(_CHUNK, limit + 1 - total))
            except OSError as exc:
                raise FileRefusedError(shown, f"cannot be read ({exc.strerror or exc})", fix) from None
            if not chunk:
                break
            chunks.append(chunk)
            total += len(chunk)
        if total > limit:  # it grew after the size check
            raise FileRefusedError(shown, f"grew past the {format_size(limit)} limit while it was "
                                   "read", fix)
    return b"".join(chunks)


def read_bounded_text(path: str | Path, limit: int, *, encoding: str = "utf-8",
                      fix: str = "give the path of a regular file") -> str:
    """`read_bounded`, decoded; undecodable bytes are one `FileRefusedError` with the offset."""
    data = read_bounded(path, limit, fix=fix)
    try:
        return data.decode(encoding)
    except UnicodeDecodeError as exc:
        raise FileRefusedError(
            str(path), f"is not {encoding} text (byte {exc.start}: {exc.reason})", fix) from None
