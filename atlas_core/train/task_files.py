"""The local files a task reads, fingerprinted in a checkpoint and checked before they are reused.

A checkpoint records the files its training task read (a text task's corpus ``path``): for each
param that names a file (`evaluate.file_params`) whose value is a regular file, its path as the
spec gave it, its size and its SHA-256 (`fingerprints`; ``meta["task"]["files"]``).

A checkpoint may come from anywhere, so a path it records must not choose what a command reads.
A recorded path is therefore used again (``atlas eval RUN`` without ``--task``, ``atlas train
--resume RUN`` without a SPEC) only when the file found there now is the file the run read: a
regular file of the recorded size (compared before a byte is read) whose SHA-256 is the recorded
one (`check_recorded`). A forged ``meta.json`` can then only name a file whose content its author
already knew; anything else is one error that says why and how to name the file instead.
"""

from __future__ import annotations

import hashlib
import os
from typing import Any, Mapping

from ..safe_files import FileRefusedError, check_regular_file

_CHUNK = 1 << 20


def sha256_of(path: str | os.PathLike, size: int) -> str:
    """The SHA-256 of the regular file ``path`` of ``size`` bytes (a file of another size, or one
    that is not regular when opened, is a `FileRefusedError`)."""
    fix = "name the file yourself"
    check_regular_file(path, size, fix=fix)
    flags = os.O_RDONLY | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_CLOEXEC", 0)
    fd = os.open(path, flags)
    digest = hashlib.sha256()
    with os.fdopen(fd, "rb", buffering=0) as fh:
        st = os.fstat(fd)
        if st.st_size != size:
            raise FileRefusedError(str(path), f"is {st.st_size} bytes, not {size}", fix)
        total = 0
        while total <= size:
            chunk = fh.read(min(_CHUNK, size + 1 - total))
            if not chunk:
                break
            digest.update(chunk)
            total += len(chunk)
    if total != size:
        raise FileRefusedError(str(path), f"changed while it was read ({total} bytes, not {size})", fix)
    return digest.hexdigest()


def fingerprints(name: str, params: Mapping[str, Any], registry=None) -> dict[str, dict[str, Any]]:
    """``{param: {"path", "bytes", "sha256"}}`` for each param of task ``name`` that names a
    regular file (a directory, e.g. a tokenizer folder, is not fingerprinted)."""
    from .evaluate import file_params

    out: dict[str, dict[str, Any]] = {}
    for key in file_params(name, registry, path="train.task"):
        value = params.get(key)
        if not isinstance(value, str):
            continue
        path = os.path.expanduser(value)
        try:
            st = check_regular_file(path)
            out[key] = {"path": value, "bytes": st.st_size, "sha256": sha256_of(path, st.st_size)}
        except (FileRefusedError, OSError):
            continue
    return out


def check_recorded(key: str, value: Any, recorded: Mapping[str, Any]) -> str | None:
    """None when the file at ``value`` (param ``key``'s value in the checkpoint's spec) is the file
    the checkpoint recorded for ``key``; otherwise why not, as a phrase."""
    entry = recorded.get(key)
    if not isinstance(entry, Mapping) or entry.get("path") != value:
        return "the checkpoint records no fingerprint of it (size and SHA-256) to check it against"
    size, digest = entry.get("bytes"), entry.get("sha256")
    if isinstance(size, bool) or not isinstance(size, int) or size < 0 or not isinstance(digest, str):
        return "the checkpoint's record of it is malformed"
    path = os.path.expanduser(str(value))
    try:
        st = check_regular_file(path)
    except FileRefusedError as exc:
        if exc.problem == "no such file":
            return f"there is no file {value!r} here (in {os.getcwd()})"
        return f"{value!r} here {exc.problem}"
    if st.st_size != size:  # the size found is not shown: the path may name anyone's file
        return (f"the file {value!r} here is not the one the run read (its size is not the "
                f"{size:,} bytes the checkpoint recorded)")
    try:
        found = sha256_of(path, size)
    except (FileRefusedError, OSError) as exc:
        return f"{value!r} here cannot be read ({getattr(exc, 'problem', exc)})"
    if found != digest:
        return (f"the file {value!r} here is not the one the run read (its SHA-256 differs from "
                "the one the checkpoint recorded)")
    return None


def unverified_files(name: str, params: Mapping[str, Any], recorded: Mapping[str, Any],
                     registry=None) -> dict[str, str]:
    """``{param: why}`` for each file param of task ``name`` (with a value) in ``params`` that the
    checkpoint's ``recorded`` fingerprints (`checkpoint_meta.CheckpointMeta.recorded_files`) do
    not vouch for (`check_recorded`); ``{}`` when all may be read."""
    from .evaluate import file_params

    out = {}
    for key in file_params(name, registry, path="train.task"):
        value = params.get(key)
        if value is None:
            continue
        why = check_recorded(key, value, recorded)
        if why is not None:
            out[key] = why
    return out
