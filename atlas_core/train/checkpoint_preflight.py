"""Cheap checks of a checkpoint's files before `load_checkpoint` reads any of them whole.

`load_checkpoint` verifies every file against the manifest, but it reads the file first and
compares sizes after: a ``manifest.json`` that is ``/dev/zero`` never ends, and a 10 GB sparse
``model.safetensors`` is read into memory before its size is found wrong. These checks look
at each file with ``stat`` and read only small, bounded parts, so such a checkpoint is one
`CheckpointError` in milliseconds:

- the manifest is a regular file of at most `METADATA_FILE_LIMIT` bytes, read with bounded
  memory (`atlas_core.safe_files`);
- every file it lists that is present is a regular file (not a device, FIFO or directory) of
  exactly the size the manifest gives; a JSON or TOML file is at most `METADATA_FILE_LIMIT`
  bytes;
- a ``.safetensors`` file's header (8-byte length, then JSON, at most `SAFETENSORS_HEADER_LIMIT`)
  parses and its tensors end exactly at the end of the file, as the format requires; a sparse
  file of zeros has a zero-length header and is refused without hashing it;
- `check_weights_fit` (once the checkpoint is loaded): the model of its spec, built on the
  ``meta`` device, has the shapes the weights file declares, so a forged ``spec.toml`` cannot
  make a command allocate a model of any size before the weights are compared.

Anything these checks do not understand (a manifest that is not JSON, an entry without a size,
a missing file) is left to `load_checkpoint`, which reports it. `checked_load_checkpoint` is the
entry point for the commands (``atlas eval``, ``atlas generate``, ``atlas train --resume``).
"""

from __future__ import annotations

import json
import os
import struct
from pathlib import Path

from ..safe_files import METADATA_FILE_LIMIT, FileRefusedError, check_regular_file, read_bounded
from .checkpoint import MANIFEST, Checkpoint, CheckpointError, find_checkpoint, load_checkpoint

# The safetensors format caps its JSON header at 100 MB; a checkpoint's is a few KiB per tensor.
SAFETENSORS_HEADER_LIMIT = 100_000_000

_FIX = "use an earlier checkpoint, or the original files of this one"


def _refused(exc: FileRefusedError) -> CheckpointError:
    return CheckpointError(f"{exc.path}: {exc.problem}; {_FIX}")


def safetensors_header(path: Path, size: int) -> dict:
    """The JSON header of the safetensors file ``path`` (``size`` bytes), after checking that
    its tensors end exactly at the end of the file; otherwise `CheckpointError`."""
    def bad(problem: str) -> CheckpointError:
        return CheckpointError(f"{path}: {problem}; {_FIX}")

    if size < 8:
        raise bad(f"is {size} bytes, shorter than a safetensors header")
    with open(path, "rb") as fh:
        (n,) = struct.unpack("<Q", fh.read(8))
        if n < 2 or n > min(SAFETENSORS_HEADER_LIMIT, size - 8):
            raise bad(f"is not a safetensors file (header length {n}, file size {size})")
        try:
            header = json.loads(fh.read(n))
        except (ValueError, UnicodeDecodeError):
            raise bad("is not a safetensors file (its header is not JSON)") from None
    if not isinstance(header, dict):
        raise bad("is not a safetensors file (its header is not a JSON object)")
    end = 0
    for name, info in header.items():
        if name == "__metadata__":
            continue
        offsets = info.get("data_offsets") if isinstance(info, dict) else None
        shape = info.get("shape") if isinstance(info, dict) else None
        if (not isinstance(offsets, list) or len(offsets) != 2 or not isinstance(shape, list)
                or not all(isinstance(o, int) and o >= 0 for o in offsets + shape)):
            raise bad(f"is not a safetensors file (tensor {name!r} has no valid shape and "
                      "data_offsets)")
        end = max(end, offsets[1])
    if 8 + n + end != size:
        raise bad(f"is not a safetensors file (its tensors end at byte {8 + n + end}, the file "
                  f"has {size})")
    return header


def check_checkpoint_files(path: str | Path) -> Path:
    """The checkpoint directory meant by ``path``, after the checks of the module docstring."""
    ckpt = find_checkpoint(path)
    try:
        raw = read_bounded(ckpt / MANIFEST, METADATA_FILE_LIMIT, fix=_FIX)
    except FileRefusedError as exc:
        raise _refused(exc) from None
    try:
        manifest = json.loads(raw)
    except (ValueError, UnicodeDecodeError):
        return ckpt  # load_checkpoint says it is unreadable
    files = manifest.get("files") if isinstance(manifest, dict) else None
    if not isinstance(files, dict):
        return ckpt
    for name, entry in files.items():
        # only plain names inside the directory: a listed "../x" is never looked at here
        if not isinstance(name, str) or name in ("", ".", "..") or "/" in name or os.sep in name:
            continue
        expected = entry.get("bytes") if isinstance(entry, dict) else None
        f = ckpt / name
        if not isinstance(expected, int) or isinstance(expected, bool) or not os.path.lexists(f):
            continue
        small = name.endswith((".json", ".toml"))
        try:
            st = check_regular_file(f, METADATA_FILE_LIMIT if small else None, fix=_FIX)
        except FileRefusedError as exc:
            raise _refused(exc) from None
        if st.st_size != expected:
            raise CheckpointError(
                f"{f}: truncated or altered ({st.st_size} bytes, the manifest says {expected}); "
                "use an earlier checkpoint")
        if name.endswith(".safetensors"):
            safetensors_header(f, st.st_size)
    return ckpt


def check_weights_fit(ckpt: Checkpoint, model_file: str = "model.safetensors") -> None:
    """Build the checkpoint's model on the ``meta`` device (shapes, no memory) and compare its
    parameter shapes with the tensors the weights file declares, before anything is allocated:
    a spec that asks for a model larger than its weights is one `CheckpointError`, not an
    allocation of whatever size the spec names."""
    import torch

    from ..model import build_model

    f = ckpt.path / model_file
    declared = {k: tuple(v["shape"]) for k, v in safetensors_header(f, f.stat().st_size).items()
                if k != "__metadata__"}
    with torch.device("meta"):
        shell = build_model(ckpt.spec)
    own = {k: tuple(v.shape) for k, v in shell.state_dict().items()}
    missing = sorted(set(own) - set(declared))
    shapes = [f"{k} {declared[k]} in the file, {own[k]} in the spec"
              for k in sorted(set(own) & set(declared)) if declared[k] != own[k]]
    if missing or shapes:
        what = (f"missing {', '.join(missing[:3])}{' ...' if len(missing) > 3 else ''}"
                if missing else f"shape {'; '.join(shapes[:3])}")
        raise CheckpointError(
            f"{f}: the weights do not fit the model of the checkpoint's spec.toml ({what}); "
            f"{_FIX}")


def checked_load_checkpoint(path: str | Path) -> Checkpoint:
    """`check_checkpoint_files`, then `load_checkpoint` (which verifies the SHA-256 of each)."""
    return load_checkpoint(check_checkpoint_files(path))
