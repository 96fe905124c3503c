"""Checkpoints: safetensors + JSON + TOML, written atomically, verified when read. No pickle.

A run directory holds ``checkpoints/step-<step:09d>/``, each with:

==========================  =====================================================================
``model.safetensors``       the model's ``state_dict`` (tied weights stored under each name)
``optimizer.safetensors``   the optimiser's tensors, ``"<param name>/<key>"`` (`optim`)
``state.safetensors``       RNG states as uint8 tensors: ``rng/data`` (the batch generator),
                            ``rng/torch`` (torch's global CPU generator), ``rng/cuda.<i>``
``meta.json``               the optimiser's non-tensor fields, the task (name, params, vocabulary
                            of a char-level text task), the last metrics
``spec.toml``               the resolved spec, enough to rebuild the model exactly
``manifest.json``           format, step, spec hash, and the size and SHA-256 of every file above
==========================  =====================================================================

Atomicity: every file is written to a temporary name and ``os.replace``-d; the files are written
into a hidden ``.step-<step>.partial-<pid>`` directory, the manifest last, and only then is that
directory renamed to ``step-<step>``. A save interrupted at any point leaves no ``step-*``
directory behind, so the last complete checkpoint stays the latest one. Older checkpoints are
pruned (``keep``) only after the new one is in place.

Reading (`load_checkpoint`) accepts a checkpoint directory, a run directory or its
``checkpoints/`` directory (the latest complete checkpoint), or a file inside a checkpoint. Every
file is checked against the manifest (size, then SHA-256) before it is parsed, so a truncated or
corrupt file is one clear `CheckpointError`, never a half-loaded model.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from torch import nn

from ..errors import AtlasError

FORMAT = "atlas-checkpoint/1"
MANIFEST = "manifest.json"
_STEP_DIR = re.compile(r"^step-(\d+)$")


class CheckpointError(AtlasError, ValueError):
    """A checkpoint that cannot be used: missing, incomplete, corrupt or from another spec."""


def arch_hash(spec: Any) -> str:
    """Digest of the parts of a spec that decide the weights: ``model``, ``memory``, ``layer``."""
    data = {k: getattr(spec, k) for k in ("model", "memory", "layer")}
    text = json.dumps(data, sort_keys=True, separators=(",", ":"), default=str)
    return hashlib.sha256(text.encode()).hexdigest()[:16]


# -- writing ------------------------------------------------------------------------------------
def _write_atomic(path: Path, data: bytes) -> None:
    """Write ``data`` to ``path`` through a temporary file in the same directory + os.replace."""
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    with open(tmp, "wb") as fh:
        fh.write(data)
        fh.flush()
        os.fsync(fh.fileno())
    os.replace(tmp, path)


def _tensor_bytes(tensors: dict[str, torch.Tensor]) -> bytes:
    from safetensors.torch import save

    return save({k: v.detach().cpu().contiguous().clone() for k, v in tensors.items()})


def step_dir_name(step: int) -> str:
    return f"step-{step:09d}"


def save_checkpoint(
    run_dir: str | Path,
    step: int,
    *,
    model: nn.Module,
    spec: Any,
    optimizer_state: tuple[dict[str, torch.Tensor], dict[str, Any]],
    rng: dict[str, torch.Tensor],
    meta: dict[str, Any],
    keep: int = 2,
) -> Path:
    """Write a complete checkpoint of ``step`` under ``run_dir/checkpoints``; returns its path."""
    root = Path(run_dir) / "checkpoints"
    root.mkdir(parents=True, exist_ok=True)
    final = root / step_dir_name(step)
    partial = root / f".{final.name}.partial-{os.getpid()}"
    if partial.exists():
        shutil.rmtree(partial)
    partial.mkdir()
    opt_tensors, opt_rest = optimizer_state
    blobs: dict[str, bytes] = {
        "model.safetensors": _tensor_bytes(model.state_dict()),
        "optimizer.safetensors": _tensor_bytes(opt_tensors),
        "state.safetensors": _tensor_bytes(rng),
        "meta.json": json.dumps({**meta, "optimizer": opt_rest}, indent=1, default=float).encode(),
        "spec.toml": spec.to_toml().encode(),
    }
    files = {}
    for name, data in blobs.items():
        _write_atomic(partial / name, data)
        files[name] = {"bytes": len(data), "sha256": hashlib.sha256(data).hexdigest()}
    manifest = {
        "format": FORMAT,
        "step": step,
        "spec_hash": spec.spec_hash,
        "arch_hash": arch_hash(spec),
        "name": spec.name,
        "created": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "torch": torch.__version__,
        "files": files,
    }
    _write_atomic(partial / MANIFEST, json.dumps(manifest, indent=1).encode())
    if final.exists():
        # Same step saved before (e.g. Ctrl-C right after a periodic save): swap it out only
        # after the new copy is complete, so there is always one complete checkpoint.
        old = root / f".{final.name}.old-{os.getpid()}"
        os.replace(final, old)
        os.replace(partial, final)
        shutil.rmtree(old, ignore_errors=True)
    else:
        os.replace(partial, final)
    _prune(root, keep)
    return final


def _prune(root: Path, keep: int) -> None:
    complete = sorted(_complete_steps(root))
    for step in complete[:-keep] if keep > 0 else []:
        shutil.rmtree(root / step_dir_name(step), ignore_errors=True)
    for stale in root.glob(".step-*.partial-*"):  # left by a save that was killed
        shutil.rmtree(stale, ignore_errors=True)


def _complete_steps(root: Path) -> list[int]:
    steps = []
    if root.is_dir():
        for child in root.iterdir():
            m = _STEP_DIR.match(child.name)
            if m and (child / MANIFEST).is_file():
                steps.append(int(m.group(1)))
    return steps


# -- reading ------------------------------------------------------------------------------------
def find_checkpoint(path: str | Path) -> Path:
    """The checkpoint directory meant by ``path`` (see the module docstring)."""
    p = Path(path).expanduser()
    if not p.exists():
        raise CheckpointError(f"no checkpoint at {str(p)!r}: the path does not exist")
    if p.is_file():
        if p.parent.joinpath(MANIFEST).exists():
            return p.parent
        raise CheckpointError(
            f"{str(p)!r} is a file, not a checkpoint; give a checkpoint directory (one holding "
            f"{MANIFEST}) or a run directory"
        )
    if (p / MANIFEST).exists():
        return p
    for root in (p / "checkpoints", p):
        steps = _complete_steps(root)
        if steps:
            return root / step_dir_name(max(steps))
    raise CheckpointError(
        f"{str(p)!r} holds no complete checkpoint (no {MANIFEST}, and no checkpoints/step-*/ "
        "with one); give a checkpoint directory written by `atlas train`"
    )


@dataclass
class Checkpoint:
    """A verified checkpoint directory; tensors are read on demand."""

    path: Path
    manifest: dict[str, Any]
    meta: dict[str, Any]
    spec: Any
    _blobs: dict[str, bytes] = field(default_factory=dict, repr=False)

    @property
    def step(self) -> int:
        return int(self.manifest["step"])

    def _tensors(self, name: str) -> dict[str, torch.Tensor]:
        from safetensors.torch import load

        try:
            return load(self._blobs[name])
        except Exception as exc:  # noqa: BLE001 - any parse failure is a corrupt file
            raise CheckpointError(f"{self.path / name}: not a readable safetensors file ({exc})") from None

    def model_tensors(self) -> dict[str, torch.Tensor]:
        return self._tensors("model.safetensors")

    def optimizer_state(self) -> tuple[dict[str, torch.Tensor], dict[str, Any]]:
        return self._tensors("optimizer.safetensors"), self.meta.get("optimizer", {})

    def rng(self) -> dict[str, torch.Tensor]:
        return self._tensors("state.safetensors")

    def load_model(self, model: nn.Module) -> None:
        """Copy the weights into ``model``; a mismatch is one `CheckpointError` with the names."""
        tensors = self.model_tensors()
        own = model.state_dict()
        missing = sorted(set(own) - set(tensors))
        unexpected = sorted(set(tensors) - set(own))
        shapes = [
            f"{k} {tuple(tensors[k].shape)} vs {tuple(own[k].shape)}"
            for k in sorted(set(own) & set(tensors))
            if tensors[k].shape != own[k].shape
        ]
        if missing or unexpected or shapes:
            parts = []
            if missing:
                parts.append(f"missing {', '.join(missing[:3])}{' ...' if len(missing) > 3 else ''}")
            if unexpected:
                parts.append(f"unexpected {', '.join(unexpected[:3])}{' ...' if len(unexpected) > 3 else ''}")
            if shapes:
                parts.append(f"shape {'; '.join(shapes[:3])}")
            raise CheckpointError(
                f"{self.path}: the weights do not fit this model ({'; '.join(parts)}); the "
                "checkpoint was written for a different spec"
            )
        model.load_state_dict(tensors, strict=True)


def _read_verified(ckpt: Path, name: str, entry: Any) -> bytes:
    f = ckpt / name
    if not isinstance(entry, dict) or "bytes" not in entry or "sha256" not in entry:
        raise CheckpointError(f"{ckpt / MANIFEST}: malformed entry for {name!r}")
    if not f.is_file():
        raise CheckpointError(f"{f}: missing (listed in {MANIFEST}); the checkpoint is incomplete")
    data = f.read_bytes()
    if len(data) != entry["bytes"]:
        raise CheckpointError(
            f"{f}: truncated or altered ({len(data)} bytes, the manifest says {entry['bytes']}); "
            "use an earlier checkpoint"
        )
    if hashlib.sha256(data).hexdigest() != entry["sha256"]:
        raise CheckpointError(f"{f}: corrupt (SHA-256 differs from the manifest); use an earlier checkpoint")
    return data


def load_checkpoint(path: str | Path) -> Checkpoint:
    """Find, verify and open a checkpoint (see the module docstring)."""
    from ..errors import SpecError
    from ..spec import load_spec

    ckpt = find_checkpoint(path)
    try:
        manifest = json.loads((ckpt / MANIFEST).read_text())
    except (OSError, ValueError) as exc:
        raise CheckpointError(f"{ckpt / MANIFEST}: unreadable manifest ({exc})") from None
    if not isinstance(manifest, dict) or manifest.get("format") != FORMAT:
        got = manifest.get("format") if isinstance(manifest, dict) else type(manifest).__name__
        raise CheckpointError(f"{ckpt / MANIFEST}: not an {FORMAT} manifest (format {got!r})")
    files = manifest.get("files") or {}
    needed = ("model.safetensors", "optimizer.safetensors", "state.safetensors", "meta.json", "spec.toml")
    absent = [n for n in needed if n not in files]
    if absent:
        raise CheckpointError(f"{ckpt / MANIFEST}: does not list {', '.join(absent)}")
    blobs = {name: _read_verified(ckpt, name, files[name]) for name in needed}
    try:
        meta = json.loads(blobs["meta.json"])
    except ValueError as exc:
        raise CheckpointError(f"{ckpt / 'meta.json'}: not JSON ({exc})") from None
    try:
        spec = load_spec(blobs["spec.toml"].decode())
    except SpecError as exc:
        raise CheckpointError(f"{ckpt / 'spec.toml'}: the saved spec does not load here: {exc}") from None
    if spec.spec_hash != manifest.get("spec_hash"):
        raise CheckpointError(
            f"{ckpt / 'spec.toml'}: resolves to spec_hash {spec.spec_hash}, the manifest says "
            f"{manifest.get('spec_hash')} (the installed components fill other defaults, or "
            "the file was edited)"
        )
    return Checkpoint(ckpt, manifest, meta, spec, blobs)
