"""Checkpoints: safetensors + JSON + TOML, written atomically, verified when read. No pickle.

A run directory holds ``checkpoints/step-<step:09d>/``, each with:

==========================  =====================================================================
``model.safetensors``       the model's ``state_dict`` (tied weights stored under each name)
``optimizer.safetensors``   the optimiser's tensors, ``"<param name>/<key>"`` (`optim`)
``state.safetensors``       RNG states as uint8 tensors: ``rng/data`` (the batch generator),
                            ``rng/torch`` (torch's global CPU generator), ``rng/cuda.<i>``
``meta.json``               the run's progress, the task (name, params, vocabulary of a
                            char-level text task), the last metrics, the optimiser's non-tensor
                            fields (`checkpoint_meta.CheckpointMeta`)
``spec.toml``               the resolved spec, enough to rebuild the model exactly
``manifest.json``           format, step, spec hash, and the size and SHA-256 of every file above
==========================  =====================================================================

Saving (`save_checkpoint`) keeps at least one complete checkpoint findable at every instant, so
a save killed at any point (SIGKILL, power loss) never loses the last checkpoint:

1. the files are written into a hidden ``.step-<step>.partial-<pid>`` directory, each file
   fsync-ed, the manifest last, then the directory itself is fsync-ed;
2. that directory is renamed to ``step-<step>`` (one atomic rename) and ``checkpoints/`` is
   fsync-ed. When ``step-<step>`` already exists (a periodic save of the last step followed by
   the final save, or Ctrl-C right after a periodic save) the old copy is first renamed to
   ``.step-<step>.old-<pid>``: between these two renames both copies are complete under their
   temporary names, and reading accepts them (below);
3. only then are older checkpoints pruned to ``keep`` (each renamed to ``.step-<step>.trash-<pid>``
   before it is deleted, so a half-deleted directory never carries a checkpoint's name) and the
   temporary directories removed.

Recovery (`recover_checkpoints`, run by every save and by the trainer before it writes into a
run directory): a temporary directory (``.partial-*`` or ``.old-*``) whose step has no
``step-<step>`` directory and whose files all match its manifest is a complete checkpoint left
by a killed save; it is renamed to ``step-<step>`` (a ``.partial`` copy, the newer one, before an
``.old`` one). Every other temporary directory (incomplete, redundant or ``.trash``) is deleted.
Recovery touches only temporary directories that no live process writes: the pid in the name is
this process's or a process that is gone, or this process holds the run's lock.

The run lock (`claim_run_dir`): the trainer holds an exclusive ``flock`` on ``<run>/run.lock``
while it writes the run, so a second ``atlas train`` into the same directory is one clear error
instead of two writers racing, and the lock holder may tidy every temporary directory. The kernel
drops the lock when the process dies, so a killed run never blocks the next one.

Test hook: `save_checkpoint` calls ``at(point)`` at each point of the protocol, in order:
``begin`` (the ``.partial`` directory exists, empty), ``files`` (after each file written),
``manifest`` (every file but the manifest written), ``rename`` (complete, not yet renamed),
``swap`` (a re-save of a step: the old copy moved aside, the new one not yet in place) and
``prune`` (the new checkpoint in place, nothing pruned yet). The trainer passes `KillAt` when
``ATLAS_CHECKPOINT_KILL_AT=<point>[:<n>]`` is set (`kill_hook_from_env`): it SIGKILLs the process
at ``<point>`` of its ``n``-th save (default the first).

Reading (`load_checkpoint`) accepts a checkpoint directory, a run directory or its
``checkpoints/`` directory (the latest complete checkpoint: the highest step among the
``step-*`` directories and the complete temporary copies of steps that have none), or a file
inside a checkpoint. A ``step-<step>`` path that a killed re-save left missing resolves to its
complete temporary copy. Reading never renames or deletes anything. Every file is checked
against the manifest (size, then SHA-256) before it is parsed, so a truncated or corrupt file is
one clear `CheckpointError`, never a half-loaded model. The large files (``model.safetensors``,
``optimizer.safetensors``) are hashed in pieces when the checkpoint is opened and read when asked
for; the weights go straight into the model (`weights_io.read_into`, which hashes the bytes it
reads again), so loading a model needs its own memory and little more.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import re
import shutil
import signal
import stat
import time
import tomllib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

import torch
from torch import nn

from .checkpoint_meta import META_FILE, CheckpointMeta
from .errors import CheckpointError
from .weights_io import file_sha256, read_into, write_tensors
from ..spec.compat import content_hash, stated_changes
from ..safe_files import FileRefusedError, check_regular_file, read_bounded
# the run directory's file operations (lock, atomic writes) live in run_dir.py; the lock's
# names stay importable from here
from .run_dir import (LOCK_FILE, RunLock, claim_run_dir, is_stale,  # noqa: F401
                      fsync_dir, holds_run_lock, write_atomic, write_text_atomic)

FORMAT = "atlas-checkpoint/1"
MANIFEST = "manifest.json"
_STEP_DIR = re.compile(r"^step-(\d+)\Z")
# Temporary directories of a save: .partial (being written), .old (a re-saved step's previous
# copy, moved aside), .trash (a pruned checkpoint being deleted).
_TEMP_DIR = re.compile(r"^\.step-(\d+)\.(partial|old|trash)-\d+\Z")
_MANIFEST_LIMIT = 16 << 20  # a manifest is a few hundred bytes; a larger one is not ours
_NEEDED = ("model.safetensors", "optimizer.safetensors", "state.safetensors", "meta.json",
           "spec.toml")
#: the large files: verified in pieces when a checkpoint is opened, read only when asked for
_STREAMED = ("model.safetensors", "optimizer.safetensors")

KILL_ENV = "ATLAS_CHECKPOINT_KILL_AT"
KILL_POINTS = ("begin", "files", "manifest", "rename", "swap", "prune")


def arch_hash(spec: Any) -> str:
    """Digest of the parts of a spec that decide the weights: ``model``, ``memory``, ``layer``."""
    data = {k: getattr(spec, k) for k in ("model", "memory", "layer")}
    text = json.dumps(data, sort_keys=True, separators=(",", ":"), default=str)
    return hashlib.sha256(text.encode()).hexdigest()[:16]


# -- writing ------------------------------------------------------------------------------------
def _tensor_bytes(tensors: dict[str, torch.Tensor]) -> bytes:
    from safetensors.torch import save

    return save({k: v.detach().cpu().contiguous().clone() for k, v in tensors.items()})


def step_dir_name(step: int) -> str:
    return f"step-{step:09d}"


class KillAt:
    """A save hook that SIGKILLs the process at ``point`` of the ``n``-th save it sees (the
    saves are counted at ``begin``, which every save reaches first)."""

    def __init__(self, point: str, n: int = 1) -> None:
        self.point, self.n, self.saves = point, n, 0

    def __call__(self, point: str) -> None:
        self.saves += point == "begin"
        if (point, self.saves) == (self.point, self.n):
            os.kill(os.getpid(), getattr(signal, "SIGKILL", signal.SIGTERM))
            os._exit(137)  # never go past the point, even where the signal is not immediate


def kill_hook_from_env(environ: Any = None) -> KillAt | None:
    """The `KillAt` that ``ATLAS_CHECKPOINT_KILL_AT=<point>[:<n>]`` asks for, or None when unset."""
    value = (os.environ if environ is None else environ).get(KILL_ENV)
    if not value:
        return None
    point, _, nth = value.partition(":")
    if point not in KILL_POINTS or not (nth == "" or (nth.isdigit() and int(nth) >= 1)):
        raise CheckpointError(
            f"{KILL_ENV}={value!r}: expected <point> or <point>:<n> (n >= 1) with a point among "
            f"{', '.join(KILL_POINTS)}; unset it outside tests"
        )
    return KillAt(point, int(nth or 1))


def save_checkpoint(
    run_dir: str | Path,
    step: int,
    *,
    model: nn.Module,
    spec: Any,
    optimizer_state: tuple[dict[str, torch.Tensor], dict[str, Any]],
    rng: dict[str, torch.Tensor],
    meta: CheckpointMeta,
    keep: int = 2,
    at: Callable[[str], None] | None = None,
) -> Path:
    """Write a complete checkpoint of ``step`` under ``run_dir/checkpoints``; returns its path.

    The protocol (temporary directory, fsync, rename, prune) is in the module docstring;
    ``at(point)`` is called at each of its points (tests kill the process there: `KillAt`)."""

    def reached(point: str) -> None:
        if at is not None:
            at(point)

    root = Path(run_dir) / "checkpoints"
    root.mkdir(parents=True, exist_ok=True)
    recover_checkpoints(root)  # a save killed earlier: adopt its complete copy, drop the rest
    final = root / step_dir_name(step)
    partial = root / f".{final.name}.partial-{os.getpid()}"
    if partial.exists():
        shutil.rmtree(partial)
    partial.mkdir()
    reached("begin")
    opt_tensors, opt_rest = optimizer_state
    files = {}
    # the large tensor files straight from the tensors (no serialised copy in memory)
    for name, tensors in (("model.safetensors", model.state_dict()), ("optimizer.safetensors", opt_tensors)):
        size, digest = write_tensors(partial / name, tensors)
        files[name] = {"bytes": size, "sha256": digest}
        reached("files")
    blobs: dict[str, bytes] = {
        "state.safetensors": _tensor_bytes(rng),
        META_FILE: dataclasses.replace(meta, optimizer=opt_rest).to_json(),
        "spec.toml": spec.to_toml().encode(),
    }
    for name, data in blobs.items():
        write_atomic(partial / name, data)
        files[name] = {"bytes": len(data), "sha256": hashlib.sha256(data).hexdigest()}
        reached("files")
    reached("manifest")
    manifest = {
        "format": FORMAT,
        "step": step,
        "spec_hash": spec.spec_hash,
        # the stored spec.toml's own tables, hashed: an unedited file is told from an edited one
        # by a later version whose resolution fills fields this one did not have
        "spec_stored_hash": content_hash(tomllib.loads(spec.to_toml())),
        "arch_hash": arch_hash(spec),
        "name": spec.name,
        "created": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "torch": torch.__version__,
        "files": files,
    }
    # Every file is fsync-ed before the manifest is written, so a manifest on disk always
    # describes files that are on disk; the manifest makes the directory complete.
    write_atomic(partial / MANIFEST, json.dumps(manifest, indent=1).encode())
    fsync_dir(partial)
    reached("rename")
    if final.exists():
        # The same step saved before (the final save after a periodic one, Ctrl-C right after
        # a periodic save). A directory cannot be renamed over a non-empty one, so the old copy
        # moves aside first; until the second rename both complete copies are findable under
        # their temporary names (find_checkpoint) and recoverable (recover_checkpoints).
        os.replace(final, root / f".{final.name}.old-{os.getpid()}")
        reached("swap")
    os.replace(partial, final)
    fsync_dir(root)  # the new name is durable before anything older is deleted
    reached("prune")
    _prune(root, keep, step)
    return final


def _prune(root: Path, keep: int, saved: int) -> None:
    """Keep the newest ``keep`` complete checkpoints (always ``saved``, the one just written),
    then delete every temporary directory."""
    # ``saved`` sorts last, so a resumed run that saves below a step from an earlier attempt
    # never prunes its own new checkpoint.
    complete = sorted(complete_steps(root), key=lambda s: (s == saved, s))
    for step in complete[:-keep] if keep > 0 else []:
        doomed = root / step_dir_name(step)
        trash = root / f".{doomed.name}.trash-{os.getpid()}"
        try:
            os.replace(doomed, trash)  # a half-deleted directory must not keep the step's name
        except OSError:
            continue
        shutil.rmtree(trash, ignore_errors=True)
    recover_checkpoints(root)


def complete_steps(root: Path) -> list[int]:
    """The steps of ``root``'s ``step-*`` directories that hold a manifest."""
    steps = []
    if root.is_dir():
        for child in root.iterdir():
            m = _STEP_DIR.match(child.name)
            if m and (child / MANIFEST).is_file():
                steps.append(int(m.group(1)))
    return steps


def _regular_size(path: Path) -> int | None:
    """The size of ``path`` if it is a regular file (not a link, FIFO or device), else None."""
    try:
        st = os.lstat(path)
    except OSError:
        return None
    return st.st_size if stat.S_ISREG(st.st_mode) else None


def _is_complete(path: Path, step: int) -> bool:
    """Whether the temporary directory ``path`` holds a complete checkpoint of ``step``: a
    manifest of this format and step whose every file is present with its size and SHA-256.

    Run directories can come from elsewhere, so nothing unbounded is read: the manifest and
    every file must be regular files, and a file is hashed only when its size matches."""
    size = _regular_size(path / MANIFEST)
    if size is None or size > _MANIFEST_LIMIT:
        return False
    try:
        manifest = json.loads((path / MANIFEST).read_bytes())
        files = manifest["files"]
        if manifest.get("format") != FORMAT or int(manifest.get("step", -1)) != step:
            return False
        for name in _NEEDED:
            if _regular_size(path / name) != files[name]["bytes"]:
                return False
            _read_verified(path, name, files[name])
    except (OSError, ValueError, KeyError, TypeError, CheckpointError):
        return False
    return True


def _recoverable(root: Path, above: int = -1) -> dict[int, Path]:
    """Per step above ``above`` that has no ``step-*`` directory: its best complete temporary
    copy (a ``.partial`` copy, written later, before an ``.old`` one). Reads, never writes."""
    if not root.is_dir():
        return {}
    temps: dict[int, list[tuple[int, str, Path]]] = {}
    for child in root.iterdir():
        m = _TEMP_DIR.match(child.name)
        if not m or m.group(2) == "trash" or int(m.group(1)) <= above:
            continue
        step = int(m.group(1))
        # any entry under the step's name wins: a copy is never renamed over it
        if not os.path.lexists(root / step_dir_name(step)):
            rank = 0 if m.group(2) == "partial" else 1
            temps.setdefault(step, []).append((rank, child.name, child))
    found = {}
    for step, copies in temps.items():
        for _, _, path in sorted(copies):
            if path.is_dir() and _is_complete(path, step):
                found[step] = path
                break
    return found


def recover_checkpoints(root: str | Path) -> list[Path]:
    """Tidy the ``checkpoints/`` directory ``root`` after a killed save: rename each complete
    temporary copy of a step that has no ``step-*`` directory to that name, then delete every
    other temporary directory. Returns the adopted checkpoint directories.

    Only directories no live process is writing are touched: those of this process and of
    processes that are gone, or all of them when this process holds the run's lock
    (`claim_run_dir`). Another live writer's ``.partial`` directory is left alone (it renames or
    deletes it itself; once it is gone, the next recovery tidies what it left)."""
    root = Path(root)
    if not root.is_dir():
        return []
    ours = holds_run_lock(root.parent)
    adopted = []
    for step, src in sorted(_recoverable(root).items()):
        if not is_stale(src.name, ours):
            continue
        dst = root / step_dir_name(step)
        os.replace(src, dst)
        adopted.append(dst)
    if adopted:
        fsync_dir(root)  # adopted names durable before the other copies are deleted
    for child in root.iterdir():
        if _TEMP_DIR.match(child.name) and is_stale(child.name, ours):
            shutil.rmtree(child, ignore_errors=True)
    return adopted


def latest_checkpoint(root: str | Path) -> Path | None:
    """The newest complete checkpoint in the ``checkpoints/`` directory ``root``: the highest
    step of a ``step-*`` directory or of a complete temporary copy; None when there is none."""
    root = Path(root)
    proper = complete_steps(root)
    best = max(proper, default=-1)
    found = _recoverable(root, above=best)
    if found:
        return found[max(found)]
    return root / step_dir_name(best) if proper else None


# -- reading ------------------------------------------------------------------------------------
def find_checkpoint(path: str | Path) -> Path:
    """The checkpoint directory meant by ``path`` (see the module docstring)."""
    p = Path(path).expanduser()
    if not p.exists():
        m = _STEP_DIR.match(p.name)
        if m:  # step-N of a re-save killed between its two renames: a complete copy remains
            copy = _recoverable(p.parent).get(int(m.group(1)))
            if copy is not None:
                return copy
        raise CheckpointError(f"no checkpoint at {str(p)!r}: the path does not exist")
    if p.is_file():
        if p.parent.joinpath(MANIFEST).is_file():
            return p.parent
        raise CheckpointError(
            f"{str(p)!r} is a file, not a checkpoint; give a checkpoint directory (one holding "
            f"{MANIFEST}) or a run directory"
        )
    if (p / MANIFEST).is_file():
        return p
    if (p / MANIFEST).exists():  # a device, FIFO or directory under the manifest's name
        try:
            check_regular_file(p / MANIFEST, fix="give a checkpoint directory written by `atlas train`")
        except FileRefusedError as exc:
            raise CheckpointError(str(exc)) from None
    for root in (p / "checkpoints", p):
        latest = latest_checkpoint(root)
        if latest is not None:
            return latest
    raise CheckpointError(
        f"{str(p)!r} holds no complete checkpoint (no {MANIFEST}, and no checkpoints/step-*/ "
        "with one); give a checkpoint directory written by `atlas train`"
    )


@dataclass
class Checkpoint:
    """A verified checkpoint directory; tensors are read on demand."""

    path: Path
    manifest: dict[str, Any]
    meta: CheckpointMeta
    spec: Any
    _blobs: dict[str, bytes] = field(default_factory=dict, repr=False)
    #: what reading it noted (a spec written by an earlier version: `_spec_upgrade`)
    notes: list[str] = field(default_factory=list)

    @property
    def step(self) -> int:
        return int(self.manifest["step"])

    def _tensors(self, name: str) -> dict[str, torch.Tensor]:
        from safetensors.torch import load

        blob = self._blobs.get(name)
        if blob is None:  # a large file, verified when the checkpoint was opened: read (and verified) now
            blob = _read_verified(self.path, name, self.manifest["files"][name])
        try:
            return load(blob)
        except Exception as exc:  # noqa: BLE001 - any parse failure is a corrupt file
            raise CheckpointError(f"{self.path / name}: not a readable safetensors file ({exc})") from None

    def model_tensors(self) -> dict[str, torch.Tensor]:
        return self._tensors("model.safetensors")

    def optimizer_state(self) -> tuple[dict[str, torch.Tensor], dict[str, Any]]:
        return self._tensors("optimizer.safetensors"), self.meta.optimizer

    def rng(self) -> dict[str, torch.Tensor]:
        return self._tensors("state.safetensors")

    def load_model(self, model: nn.Module) -> None:
        """Copy the weights into ``model`` (any dtype: converted on the way), in one pass over the
        file with no second copy in memory (`weights_io.read_into`); a mismatch is one
        `CheckpointError` with the names, a file whose bytes differ from the manifest's SHA-256 one
        `CheckpointError` after the pass."""
        entry = self.manifest["files"]["model.safetensors"]
        read_into(model, self.path / "model.safetensors", entry["bytes"], entry["sha256"])


def _checked_size(ckpt: Path, name: str, entry: Any) -> int:
    """The size the manifest gives ``name``, after checking the file is regular and that size."""
    f = ckpt / name
    if not isinstance(entry, dict) or "bytes" not in entry or "sha256" not in entry:
        raise CheckpointError(f"{ckpt / MANIFEST}: malformed entry for {name!r}")
    want = entry["bytes"]
    if isinstance(want, bool) or not isinstance(want, int) or want < 0:
        raise CheckpointError(f"{ckpt / MANIFEST}: malformed size for {name!r} ({want!r})")
    size = _regular_size(f)
    if size is None:
        raise CheckpointError(f"{f}: missing or not a regular file (listed in {MANIFEST}); the "
                              "checkpoint is incomplete")
    if size != want:  # compared before a byte is read: a forged or huge file is never loaded
        raise CheckpointError(
            f"{f}: truncated or altered ({size} bytes, the manifest says {want}); "
            "use an earlier checkpoint"
        )
    return want


def _verify_streaming(ckpt: Path, name: str, entry: Any) -> None:
    """Size and SHA-256 of a large file, hashed in pieces (nothing kept)."""
    _checked_size(ckpt, name, entry)
    if file_sha256(ckpt / name) != entry["sha256"]:
        raise CheckpointError(f"{ckpt / name}: corrupt (SHA-256 differs from the manifest); use an earlier checkpoint")


def _read_verified(ckpt: Path, name: str, entry: Any) -> bytes:
    want = _checked_size(ckpt, name, entry)
    try:
        data = read_bounded(ckpt / name, want)
    except FileRefusedError as exc:
        raise CheckpointError(str(exc)) from None
    if hashlib.sha256(data).hexdigest() != entry["sha256"]:
        raise CheckpointError(f"{ckpt / name}: corrupt (SHA-256 differs from the manifest); use an earlier checkpoint")
    return data


def _stored_spec(data: bytes) -> Any:
    """The resolved spec of a checkpoint's ``spec.toml``."""
    from ..host.manager import get_registry
    from ..spec import load_spec

    return load_spec(data.decode(), registry=get_registry())


def _read_manifest(ckpt: Path) -> dict[str, Any]:
    try:
        manifest = json.loads(read_bounded(ckpt / MANIFEST, _MANIFEST_LIMIT))
    except FileRefusedError as exc:
        raise CheckpointError(str(exc)) from None
    except (OSError, ValueError) as exc:
        raise CheckpointError(f"{ckpt / MANIFEST}: unreadable manifest ({exc})") from None
    if not isinstance(manifest, dict) or manifest.get("format") != FORMAT:
        got = manifest.get("format") if isinstance(manifest, dict) else type(manifest).__name__
        raise CheckpointError(f"{ckpt / MANIFEST}: not an {FORMAT} manifest (format {got!r})")
    return manifest


def load_checkpoint(path: str | Path) -> Checkpoint:
    """Find, verify and open a checkpoint (see the module docstring)."""
    from ..errors import SpecError

    ckpt = find_checkpoint(path)
    manifest = _read_manifest(ckpt)
    files = manifest.get("files") or {}
    needed = _NEEDED
    absent = [n for n in needed if n not in files]
    if absent:
        raise CheckpointError(f"{ckpt / MANIFEST}: does not list {', '.join(absent)}")
    blobs = {name: _read_verified(ckpt, name, files[name]) for name in needed if name not in _STREAMED}
    for name in _STREAMED:  # hashed in pieces now, read when asked for (Checkpoint.load_model)
        _verify_streaming(ckpt, name, files[name])
    meta = CheckpointMeta.from_json(blobs[META_FILE], ckpt / META_FILE)
    try:
        spec = _stored_spec(blobs["spec.toml"])
    except SpecError as exc:
        raise CheckpointError(f"{ckpt / 'spec.toml'}: the saved spec does not load here: {exc}") from None
    notes = _spec_upgrade(ckpt, manifest, blobs["spec.toml"], spec)
    checkpoint = Checkpoint(ckpt, manifest, meta, spec, blobs)
    checkpoint.notes = notes
    return checkpoint


def _spec_upgrade(ckpt: Path, manifest: dict, data: bytes, spec: Any) -> list[str]:
    """Check the stored spec against its resolution here: the same `spec_hash`, or (a spec an
    earlier version wrote, whose resolution here fills fields that version did not have) every
    value it states kept and, where the manifest records it, the stored tables unedited
    (`atlas_core.spec.compat`). Returns the notes of an upgrade; an edited or changed spec is a
    `CheckpointError`."""
    recorded = manifest.get("spec_hash")
    if spec.spec_hash == recorded:
        return []
    stored = tomllib.loads(data.decode())
    why = ""
    # a manifest without the stored hash (written before it was recorded) relies on the file's own
    # SHA-256, checked already
    if manifest.get("spec_stored_hash") not in (None, content_hash(stored)):
        why = "the file was edited after it was saved"
    changed = stated_changes(stored, spec.to_dict())
    if changed and not why:
        why = f"the installed components resolve {', '.join(changed[:4])} otherwise"
    if why:
        raise CheckpointError(
            f"{ckpt / 'spec.toml'}: resolves to spec_hash {spec.spec_hash}, the manifest says "
            f"{recorded} ({why}); install the versions it was saved with")
    return [f"the spec was saved by an earlier version (spec_hash {recorded}); every value it states "
            f"is kept, and this version's defaults fill the fields it lacks (spec_hash {spec.spec_hash})"]
