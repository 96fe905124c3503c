"""From command-line options to a checked training plan: spec, overrides, resume, run directory.

Everything that can be wrong with the user's input is found here, before a model is built or a
process is spawned, and reported as one error: a spec problem (`SpecError`), a checkpoint that is
missing, corrupt or written for another spec (`CheckpointError`), a run directory that already
holds a run (`RunDirError`), a task that cannot be built (missing or empty text file, a sequence
length the task does not allow). Nothing is written until the plan is complete.

Rules:
- without a spec, ``atlas train`` uses the embedded default (`DEFAULT_SPEC`, a small MQAR run), or,
  with ``--resume``, the spec saved in the checkpoint, unless its task reads a file (a text task's
  ``path``): a checkpoint cannot choose which local files are read, so that resume takes a SPEC;
- ``compile = true`` on the CPU needs a C++ compiler (torch.compile's CPU code generator builds C++):
  without one on PATH (``$CXX``, ``g++``, ``c++``, ``clang++``) the plan is refused with one
  error naming ``train.compile``;
- ``--steps``, ``--seed``, ``--device`` override ``[train]`` and are saved in the resolved spec;
- resuming with a spec requires the same model (``model``, ``memory``, ``layer``: the
  `arch_hash`); the ``[train]`` table may differ (e.g. more steps);
- a fresh run never writes into a directory that already holds one: ``--out DIR`` must be new
  or empty of runs, and without ``--out`` the first free ``runs/<name>``, ``runs/<name>-2``, ...
  is used.
"""

from __future__ import annotations

import dataclasses
import importlib.resources
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..errors import Issue, SpecError
from .errors import RunDirError  # noqa: F401  (raised here; importable from here)
from .checkpoint import Checkpoint, CheckpointError, arch_hash, complete_steps
from .checkpoint_meta import CheckpointMeta
from .checkpoint_preflight import check_weights_fit, checked_load_checkpoint
from .metrics import METRICS_FILE, run_finished
from .params import TrainParams, train_params

DEFAULT_SPEC = "default_mqar.toml"


class RunComplete(Exception):
    """``--resume`` of a run that already finished the steps asked for (its last step saved and
    evaluated, its end marker written): nothing to train, and not an error, so a scheduler that
    requeues a job with ``--resume`` sees it succeed. ``result`` is the run's result as training
    returned it (from the checkpoint), ``line`` says so for a person."""

    def __init__(self, ckpt: Checkpoint, spec: Any, run_dir: Path, resume: str) -> None:
        last = ckpt.meta.last_eval or {}
        elapsed = ckpt.meta.elapsed_s
        nan = float("nan")
        self.result: dict[str, Any] = {
            "name": spec.name, "arch": spec.arch, "spec_hash": spec.spec_hash,
            "steps": ckpt.step, "eval_loss": last.get("loss", nan),
            "accuracy": last.get("accuracy", nan), "perplexity": last.get("perplexity", nan),
            "eval_tokens": last.get("tokens", 0), "time_s": elapsed,
            "tokens_per_s": ckpt.meta.tokens_seen / max(elapsed, 1e-9),
            "run_dir": str(run_dir), "checkpoint": str(ckpt.path), "complete": True,
        }
        self.line = (f"train: the run {run_dir} is complete (step {ckpt.step} of {ckpt.step} saved "
                     f"and evaluated): nothing to train; to train further: atlas train --resume "
                     f"{resume} --steps N with N > {ckpt.step}")
        super().__init__(self.line)


def default_spec_text() -> str:
    """The TOML of the embedded default spec (``atlas_core/data/default_mqar.toml``)."""
    return importlib.resources.files("atlas_core").joinpath("data", DEFAULT_SPEC).read_text()


@dataclass
class TrainOptions:
    """What ``atlas train`` was asked (picklable: it is handed to spawned workers)."""

    #: a path, TOML text, a mapping or a resolved `Spec` (used as it is); None: the default spec,
    #: or the checkpoint's
    spec: Any = None
    out: str | None = None
    resume: str | None = None
    steps: int | None = None
    seed: int | None = None
    device: str | None = None
    progress: bool = True
    shard: str = "ddp"  # the data-parallel engine: "ddp" or "fsdp" (atlas_core.train.data_parallel)
    context_parallel: int = 1  # ranks that split each sequence along time (atlas_core.distributed)
    threads: tuple[int, str] | None = None  # (count, reason) the launcher chose for its workers
    run_dir_checked: bool = False  # set by the launcher once the directory was chosen
    #: set by `launch.prepare`, which reads the run directory once: the opened checkpoint of
    #: ``resume`` (the plan uses it as it is) and the line that says an unsaved run starts again
    prepared: bool = False
    checkpoint: Checkpoint | None = None
    note: str | None = None


@dataclass
class Plan:
    spec: Any  # the resolved Spec, overrides applied
    train: TrainParams
    run_dir: Path
    device: str
    resume: Checkpoint | None
    source: str
    task: Any = None  # the built training task (checked here: files exist, lengths fit)


def _flat(data: Any, prefix: str = "") -> dict[str, Any]:
    if isinstance(data, dict):
        out: dict[str, Any] = {}
        for k, v in data.items():
            out.update(_flat(v, f"{prefix}.{k}" if prefix else str(k)))
        return out
    return {prefix: data}


def spec_difference(a: Any, b: Any, limit: int = 3) -> str:
    """The first differing dotted keys of two specs' model/memory/layer tables."""
    fa = _flat({k: getattr(a, k) for k in ("model", "memory", "layer")})
    fb = _flat({k: getattr(b, k) for k in ("model", "memory", "layer")})
    keys = sorted(k for k in set(fa) | set(fb) if fa.get(k) != fb.get(k))
    parts = [f"{k}: {fb.get(k)!r} in the checkpoint, {fa.get(k)!r} here" for k in keys[:limit]]
    more = f" (+{len(keys) - limit} more)" if len(keys) > limit else ""
    return "; ".join(parts) + more


def resolve_device(requested: str) -> str:
    import torch

    if requested == "auto":
        return "cuda" if torch.cuda.is_available() else "cpu"
    if requested == "cuda" and not torch.cuda.is_available():
        raise SpecError([Issue("train.device", "CUDA is not available in this torch build or "
                               "machine", "cuda", "use device = 'cpu' or 'auto'")])
    return requested


CXX_NAMES = ("g++", "c++", "clang++")


def cpp_compiler() -> str | None:
    """The C++ compiler torch.compile would use on the CPU (``$CXX`` first), or None."""
    import os
    import shutil

    for name in (os.environ.get("CXX"), *CXX_NAMES):
        if name and shutil.which(name):
            return shutil.which(name)
    return None


def check_compile(params: TrainParams, device: str) -> None:
    """Refuse ``compile = true`` where torch.compile cannot build code (see the module doc)."""
    if params.compile and device == "cpu" and cpp_compiler() is None:
        raise SpecError([Issue(
            "train.compile", "torch.compile on the CPU needs a C++ compiler and none was found "
            f"on PATH (looked for $CXX, {', '.join(CXX_NAMES)})", True,
            "install one (e.g. apt-get install g++) or set compile = false")])


def _load(source: Any):
    """The resolved spec of ``source`` and a label for messages. A `Spec` (resolved by the caller:
    `atlas_core.api.train` applies the overrides) is used as it is: nothing is resolved twice."""
    from ..spec import Spec, load_spec

    if isinstance(source, Spec):
        return source, _label(source.source)
    if source is None:
        return load_spec(default_spec_text()), "the default MQAR spec"
    if isinstance(source, dict):
        return load_spec(source), "the spec given"
    text = str(source)
    check_spec_file(text)
    label = text if "\n" not in text else "the spec given"
    return load_spec(Path(text) if "\n" not in text else text), label


def check_spec_file(source: Any) -> None:
    """Refuse a one-line string that names no file: a spec is a path, or TOML text."""
    if isinstance(source, str) and "\n" not in source and not Path(source).exists():
        raise SpecError([Issue("", f"no such spec file {source!r}", None,
                               "give the path of a .toml spec, or no SPEC for the default")])


def _label(source: str | None) -> str:
    """How messages name a resolved spec: its file, else "the spec given" (not ``<string>``)."""
    return source if source and not source.startswith("<") else "the spec given"


def _fresh_run_dir(out: str | None, name: str) -> Path:
    def holds_run(d: Path) -> bool:
        return (d / METRICS_FILE).exists() or bool(complete_steps(d / "checkpoints"))

    if out is not None:
        d = Path(out).expanduser()
        if d.exists() and not d.is_dir():
            raise RunDirError(f"--out {out!r} is a file; give a directory")
        if d.is_dir() and holds_run(d):
            raise RunDirError(
                f"--out {out!r} already holds a run; continue it with --resume {out}, or give "
                "another --out (nothing was overwritten)"
            )
        return d
    base = Path("runs") / (re.sub(r"[^A-Za-z0-9._-]+", "-", name).strip("-") or "run")
    d, i = base, 1
    while d.exists() and (holds_run(d) or any(d.iterdir())):
        i += 1
        d = base.with_name(f"{base.name}-{i}")
    return d


def refuse_stored_files(spec: Any, source: str, resume: str, meta: CheckpointMeta | None) -> None:
    """A checkpoint's own spec may choose the local files a run reads (a text task's ``path``)
    only when each is the file the run read: ``source`` is the checkpoint's ``spec.toml``, and
    the checkpoint's ``meta`` recorded the file's size and SHA-256 (`task_files`). Otherwise
    resuming such a run takes a SPEC named on the command line. ``meta`` None: ``source`` is a
    run's own ``spec.toml`` (the run stopped before a checkpoint recorded its files)."""
    from ..host.registry import split_use
    from .evaluate import without_file_params
    from .task_files import unverified_files

    task = (spec.train or {}).get("task")
    if task is None:
        return
    name, raw = split_use(task, "train.task")
    _, files = without_file_params(name, raw, path="train.task")
    files = {k: v for k, v in files.items() if v is not None}  # an unset param names no file
    if not files:
        return
    if meta is None:
        refused = {k: "no checkpoint of the run recorded its size and SHA-256" for k in files}
    else:
        refused = unverified_files(name, files, meta.recorded_files())
    if refused:
        key = sorted(refused)[0]
        raise CheckpointError(
            f"{source}: its [train] task reads {key} = {files[key]!r}, and a checkpoint's file "
            f"is read again only when it is the file the run read: {refused[key]}; resume with "
            f"a spec you name: check that file's [train] task, then run atlas train {source} "
            f"--resume {resume}"
        )


def make_plan(opts: TrainOptions, world: int = 1) -> Plan:
    """Check every input and decide the run (see the module docstring)."""
    ckpt = opts.checkpoint
    if ckpt is None and opts.resume:
        ckpt = checked_load_checkpoint(opts.resume)
    if opts.spec is None and ckpt is not None:
        spec, source = ckpt.spec, str(ckpt.path / "spec.toml")
        refuse_stored_files(spec, source, opts.resume, ckpt.meta)
    else:
        spec, source = _load(opts.spec)
    if ckpt is not None and arch_hash(spec) != arch_hash(ckpt.spec):  # both resolved here
        raise CheckpointError(
            f"the checkpoint {str(ckpt.path)!r} was written for a different model than {source} "
            f"({spec_difference(spec, ckpt.spec)}); a run keeps its model: resume with the "
            "checkpoint's own spec (no SPEC, and no override of [model], [memory] or [layer]) or "
            "with a SPEC of the same model, or start a new run with --out"
        )
    if ckpt is not None:
        check_weights_fit(ckpt)  # before the trainer allocates the model the spec describes
    train = dict(spec.train) if spec.train is not None else {}
    for key, value in (("steps", opts.steps), ("seed", opts.seed), ("device", opts.device)):
        if value is not None:
            train[key] = value
    if spec.train is None or train != spec.train:  # only [train] is validated again
        from ..spec.resolve import with_train

        spec = with_train(spec, train)
    params = train_params(spec.train)
    device = resolve_device(params.device)
    check_compile(params, device)
    if params.batch_size % world:
        raise SpecError([Issue("train.batch_size", f"must be divisible by the {world} processes "
                               "(each takes an equal share of the global batch)", params.batch_size,
                               f"use a multiple of {world}")])
    from .evaluate import build_task

    task = build_task(params.task, int(spec.model.get("vocab_size", 0)), params.seq_len)
    if ckpt is not None:
        cp = ckpt.path
        default_dir = cp.parent.parent if cp.parent.name == "checkpoints" else cp.parent
        run_dir = Path(opts.out).expanduser() if opts.out else default_dir
        # a run stopped after its last step was saved (killed in or after the final save) still
        # owes its final evaluation and end marker: resuming it trains no step and finishes it
        unfinished = params.steps == ckpt.step and not run_finished(run_dir)
        if params.steps == ckpt.step and not unfinished:  # a requeued job: already done
            raise RunComplete(ckpt, spec, run_dir, opts.resume)
        if params.steps < ckpt.step:
            raise CheckpointError(
                f"the checkpoint {str(ckpt.path)!r} is at step {ckpt.step} and the run has "
                f"steps = {params.steps}: nothing left to train; pass --steps N with N > {ckpt.step}"
            )
    elif opts.run_dir_checked and opts.out:
        run_dir = Path(opts.out)
    else:
        run_dir = _fresh_run_dir(opts.out, spec.name)
    return Plan(spec, params, run_dir, device, ckpt, source, task)


def worker_options(opts: TrainOptions, plan: Plan) -> TrainOptions:
    """The options a spawned worker gets: the resolved spec (not resolved again there) and the
    chosen directory."""
    return dataclasses.replace(opts, spec=plan.spec, out=str(plan.run_dir),
                               steps=None, seed=None, device=None, run_dir_checked=True,
                               prepared=False, checkpoint=None, note=None)
