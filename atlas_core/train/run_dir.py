"""The file operations of a run directory: its lock, atomic files and durable renames. One trainer
per run directory, never a half written file, and the test of whether a temporary directory still
has a live writer (which checkpoint recovery, `atlas_core.train.checkpoint.recover_checkpoints`,
relies on).

- `claim_run_dir` creates the run directory (with its ``spec.toml`` already inside, in one
  rename) and takes an exclusive ``flock`` on ``run.lock``; the kernel releases it however the
  process ends, so a killed run never leaves a stale lock;
- `write_atomic` / `write_text_atomic` write through a temporary file, fsync and rename;
  `fsync_dir` makes a directory's entries (created, renamed files) durable;
- `is_stale` says whether a ``.<name>.<kind>-<pid>`` directory belongs to no live writer.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path
from typing import Any

from .errors import CheckpointError


def fsync_dir(path: Path) -> None:
    """Make the entries of directory ``path`` (created, renamed files) durable."""
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:  # a platform that cannot open a directory (Windows): nothing to sync
        return
    try:
        os.fsync(fd)
    except OSError:  # a filesystem that refuses fsync on a directory
        pass
    finally:
        os.close(fd)


def write_atomic(path: str | Path, data: bytes) -> None:
    """Write ``data`` to ``path`` so that a reader (or a killed writer) never leaves it half
    written: a temporary file in the same directory, fsync-ed, then renamed over ``path``."""
    path = Path(path)
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    with open(tmp, "wb") as fh:
        fh.write(data)
        fh.flush()
        os.fsync(fh.fileno())
    os.replace(tmp, path)


def write_text_atomic(path: str | Path, text: str) -> None:
    """`write_atomic` of ``text`` (UTF-8)."""
    write_atomic(path, text.encode("utf-8"))


def pid_alive(pid: int) -> bool:
    """Whether process ``pid`` exists and can still write (a zombie, killed but not yet reaped by
    its parent, cannot). Unsure means alive: a directory is kept rather than deleted."""
    if pid <= 0:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except OSError:  # PermissionError: another user's live process
        return True
    try:
        with open(f"/proc/{pid}/stat", "rb") as fh:
            state = fh.read().rsplit(b")", 1)[1].split()[0]
    except (OSError, IndexError):
        return True
    return state not in (b"Z", b"X")


def is_stale(name: str, ours: bool) -> bool:
    """Whether the temporary directory ``name`` (``.step-N.<kind>-<pid>``) belongs to no live
    writer: its process is this one (which is not writing it now) or is gone, or this process
    holds the run's lock (no other process can be writing the run)."""
    pid = int(name.rsplit("-", 1)[1])
    return ours or pid == os.getpid() or not pid_alive(pid)


# -- the run lock -------------------------------------------------------------------------------
LOCK_FILE = "run.lock"
_held: dict[str, "RunLock"] = {}


class RunLock:
    """An exclusive ``flock`` on ``<run dir>/run.lock``, held by the process that trains the run
    (the file holds its pid, for the message another process gets). The kernel releases it when
    the process ends, however it ends, so a killed run never leaves a stale lock."""

    def __init__(self, key: str, fh: Any) -> None:
        self.key, self._fh = key, fh

    @property
    def held(self) -> bool:
        return self._fh is not None and not self._fh.closed

    def release(self) -> None:
        if self.held:
            self._fh.close()  # closing the file releases the lock
        if _held.get(self.key) is self:
            del _held[self.key]


def _lock(fh: Any, run_dir: Path) -> None:
    import fcntl

    try:
        fcntl.flock(fh.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
        fh.seek(0)
        who = fh.read(32).strip()
        fh.close()
        raise CheckpointError(
            f"{run_dir} is being trained by another process{f' (pid {who})' if who else ''}; "
            "wait for it to finish, stop it, or train into another directory (--out)"
        ) from None
    fh.seek(0)
    fh.truncate()
    fh.write(f"{os.getpid()}\n")
    fh.flush()


def _create_with_spec(run_dir: Path, spec_text: str) -> Any:
    """Create ``run_dir`` holding its lock file (locked) and ``spec.toml`` in one rename: a run
    directory never exists without its spec. Returns the locked file, or None when another
    process created the directory first."""
    tmp = run_dir.with_name(f".{run_dir.name}.new-{os.getpid()}")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    fh = open(tmp / LOCK_FILE, "a+")
    _lock(fh, run_dir)
    write_text_atomic(tmp / "spec.toml", spec_text)
    fsync_dir(tmp)
    try:
        os.rename(tmp, run_dir)  # the open file and its lock move with the directory
    except OSError:  # created meanwhile by someone else: use it as it is
        fh.close()
        shutil.rmtree(tmp, ignore_errors=True)
        return None
    fsync_dir(run_dir.parent)
    return fh


def _tidy_new_dirs(run_dir: Path) -> None:
    """Delete ``.<name>.new-<pid>`` siblings that a process killed while creating ``run_dir``
    left behind (only those of processes that are gone)."""
    prefix = f".{run_dir.name}.new-"
    try:
        siblings = list(run_dir.parent.iterdir())
    except OSError:
        return
    for child in siblings:
        pid = child.name[len(prefix):]
        if child.name.startswith(prefix) and pid.isdigit() and is_stale(child.name, False):
            shutil.rmtree(child, ignore_errors=True)


def claim_run_dir(run_dir: str | Path, spec_text: str | None = None) -> RunLock | None:
    """Create ``run_dir`` (when it does not exist) and take its lock; a `CheckpointError` when
    another process holds it.

    With ``spec_text``, a new run directory is created with its ``spec.toml`` already inside (one
    rename), so a run killed at any moment leaves either no directory or one that ``--resume``
    can start again. The same process may claim a run directory again (a resumed run after an
    interrupted one, in one interpreter): it gets the lock it holds. None where ``fcntl`` does
    not exist (Windows): there, recovery falls back to process ids alone."""
    run_dir = Path(run_dir)
    try:
        import fcntl  # noqa: F401
    except ImportError:  # pragma: no cover - not on POSIX
        run_dir.mkdir(parents=True, exist_ok=True)
        return None
    fh = None
    if spec_text is not None and not run_dir.exists():
        run_dir.parent.mkdir(parents=True, exist_ok=True)
        _tidy_new_dirs(run_dir)
        fh = _create_with_spec(run_dir, spec_text)
    run_dir.mkdir(parents=True, exist_ok=True)
    key = str(run_dir.resolve())
    lock = _held.get(key)
    if lock is not None and lock.held:
        return lock
    if fh is None:
        fh = open(run_dir / LOCK_FILE, "a+")
        _lock(fh, run_dir)
    for child in run_dir.glob(".spec.toml.tmp-*"):  # a write killed before its rename
        if child.name.rsplit("-", 1)[1].isdigit():
            child.unlink(missing_ok=True)  # the lock is ours: no one else writes this run
    lock = RunLock(key, fh)
    _held[key] = lock
    return lock


def holds_run_lock(run_dir: str | Path) -> bool:
    """Whether this process holds the lock of ``run_dir`` (`claim_run_dir`)."""
    try:
        lock = _held.get(str(Path(run_dir).resolve()))
    except OSError:
        return False
    return lock is not None and lock.held

