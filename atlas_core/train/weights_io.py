"""Large safetensors files of a checkpoint, written and read without a second copy in memory.

- `write_tensors(path, tensors)`: the file written straight from the tensors (a tensor whose
  storage another one shares, e.g. a head tied to the embedding, is copied once), fsync-ed;
  returns its size and SHA-256, hashed from the file in pieces.
- `file_sha256(path)`: the SHA-256 of a file read in pieces (nothing kept).
- `read_into(module, path, size, sha256)`: a model's ``state_dict`` filled from the file in one
  pass, each tensor's bytes read straight into the parameter (or, where the dtypes differ, in
  pieces of at most `PIECE` bytes converted on the way), every byte read hashed; a file whose
  SHA-256 is not the manifest's is a `CheckpointError` after the pass (the module is then not
  returned to anyone: the caller's load fails). The peak memory of a load is the model plus one
  piece, not the model plus the file plus its parse.
"""

from __future__ import annotations

import hashlib
import json
import os
import struct
from pathlib import Path
from typing import Any

import torch
from torch import nn

from .errors import CheckpointError

PIECE = 64 << 20  # bytes a read converts at a time, and a hash reads at a time
HEADER_LIMIT = 100 << 20  # a safetensors header larger than this is not ours

#: safetensors dtype names -> torch dtypes
DTYPES = {"F64": torch.float64, "F32": torch.float32, "F16": torch.float16, "BF16": torch.bfloat16,
          "I64": torch.int64, "I32": torch.int32, "I16": torch.int16, "I8": torch.int8, "U8": torch.uint8,
          "BOOL": torch.bool}


def file_sha256(path: str | Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as fh:
        while chunk := fh.read(PIECE):
            h.update(chunk)
    return h.hexdigest()


def write_tensors(path: str | Path, tensors: dict[str, torch.Tensor]) -> tuple[int, str]:
    """Write ``tensors`` as a safetensors file at ``path`` (fsync-ed); ``(bytes, sha256)``."""
    from safetensors.torch import save_file

    kept: set[int] = set()  # storages already written: safetensors refuses shared storage
    out = {}
    for name, t in tensors.items():
        t = t.detach().cpu().contiguous()
        ptr = t.untyped_storage().data_ptr()
        out[name] = t.clone() if ptr in kept else t
        kept.add(ptr)
    save_file(out, str(path))
    with open(path, "rb") as fh:
        os.fsync(fh.fileno())
    return os.path.getsize(path), file_sha256(path)


def _header(fh, path: Path, size: int) -> tuple[dict[str, Any], bytes]:
    raw = fh.read(8)
    if len(raw) < 8:
        raise CheckpointError(f"{path}: shorter than a safetensors header")
    (n,) = struct.unpack("<Q", raw)
    if n < 2 or n > min(HEADER_LIMIT, size - 8):
        raise CheckpointError(f"{path}: not a safetensors file (header length {n}, file size {size})")
    text = fh.read(n)
    try:
        header = json.loads(text)
    except (ValueError, UnicodeDecodeError):
        raise CheckpointError(f"{path}: not a safetensors file (its header is not JSON)") from None
    if not isinstance(header, dict):
        raise CheckpointError(f"{path}: not a safetensors file (its header is not a JSON object)")
    header.pop("__metadata__", None)
    return header, raw + text


def read_into(module: nn.Module, path: str | Path, size: int, sha256: str) -> None:
    """Fill ``module.state_dict()`` from the safetensors file ``path`` (module docstring)."""
    path = Path(path)
    own = module.state_dict()
    h = hashlib.sha256()
    with open(path, "rb") as fh:
        header, head = _header(fh, path, size)
        h.update(head)
        missing = sorted(set(own) - set(header))
        unexpected = sorted(set(header) - set(own))
        shapes = [f"{k} {tuple(header[k].get('shape', ()))} vs {tuple(own[k].shape)}"
                  for k in sorted(set(own) & set(header)) if list(own[k].shape) != header[k].get("shape")]
        if missing or unexpected or shapes:
            parts = [f"{what} {', '.join(keys[:3])}{' ...' if len(keys) > 3 else ''}" for what, keys in
                     (("missing", missing), ("unexpected", unexpected)) if keys]
            if shapes:
                parts.append(f"shape {'; '.join(shapes[:3])}")
            raise CheckpointError(f"{path.parent}: the weights do not fit this model ({'; '.join(parts)}); "
                                  "the checkpoint was written for a different spec")
        pos = 0
        with torch.no_grad():
            for name, info in sorted(header.items(), key=lambda kv: kv[1]["data_offsets"][0]):
                start, end = info["data_offsets"]
                dtype = DTYPES.get(info.get("dtype"))
                if start != pos or dtype is None:
                    raise CheckpointError(f"{path}: not a safetensors file this reader takes (tensor "
                                          f"{name!r}: dtype {info.get('dtype')}, bytes {start}..{end})")
                _fill(fh, own[name], dtype, end - start, h, path)
                pos = end
        if fh.read(1):
            raise CheckpointError(f"{path}: bytes after the last tensor; use an earlier checkpoint")
    if h.hexdigest() != sha256:
        raise CheckpointError(f"{path}: corrupt (SHA-256 differs from the manifest); use an earlier checkpoint")


def _fill(fh, dst: torch.Tensor, dtype: torch.dtype, nbytes: int, h, path: Path) -> None:
    """Read ``nbytes`` (a tensor of ``dtype``, ``dst``'s shape) into ``dst``, hashing them."""
    item = torch.empty((), dtype=dtype).element_size()
    n = dst.numel()
    if nbytes != n * item:
        raise CheckpointError(f"{path}: a tensor's bytes do not match its shape and dtype")
    if n == 0:
        return
    if dst.dtype == dtype and dst.is_contiguous() and dst.device.type == "cpu":
        view = memoryview(dst.view(-1).view(torch.uint8).numpy())
        if fh.readinto(view) != nbytes:
            raise CheckpointError(f"{path}: truncated")
        h.update(view)
        return
    target = dst if dst.is_contiguous() else torch.empty(dst.shape, dtype=dst.dtype)
    flat, per = target.view(-1), max(1, PIECE // item)
    for a in range(0, n, per):  # in pieces, converted to the destination's dtype on the way
        b = min(n, a + per)
        buf = bytearray(fh.read((b - a) * item))
        if len(buf) != (b - a) * item:
            raise CheckpointError(f"{path}: truncated")
        h.update(buf)
        flat[a:b].copy_(torch.frombuffer(buf, dtype=dtype))
    if target is not dst:
        dst.copy_(target)


__all__ = ["file_sha256", "read_into", "write_tensors", "PIECE"]
