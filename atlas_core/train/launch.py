"""The entry points of training: `train` (what ``atlas train`` and `atlas_core.api.train` run)
checks everything, then runs a `Trainer` in this process, in ``nproc`` spawned processes
(`run_plan` in each) or as one rank of a ``torchrun`` launch.

A killed run (SIGKILL, power loss, even in the middle of a save) is continued with ``--resume``:
before writing, the trainer adopts a complete checkpoint that a killed save left under a
temporary name and deletes the rest (`checkpoint.recover_checkpoints`). A run stopped before its
first checkpoint has nothing to resume: `train` starts it again from step 0 in the same directory
(``--resume DIR``, with the run's saved ``spec.toml`` unless a SPEC is given, or a fresh run with
``--out DIR``) and says so in one line on stderr (`restart_unsaved`).

`prepare` reads the run directory once, before anything else: it restarts an unsaved run (its
``spec.toml`` resolved) or opens the checkpoint ``--resume`` names (verified, its spec resolved),
and the options it returns carry what it read to the plan (`setup.make_plan`), so neither is
read or resolved again. `atlas_core.api.train` prepares a resume first when it overrides the
checkpoint's spec.
"""

from __future__ import annotations

import dataclasses
import sys
from pathlib import Path
from typing import Any, Callable

import torch

from ..allocator import configure as configure_allocator
from .checkpoint import latest_checkpoint
from .data_parallel import SINGLE, DistInfo, from_env
from .errors import TrainingInterrupted
from .checkpoint_preflight import checked_load_checkpoint
from .metrics import METRICS_FILE, run_finished
from .run_dir import LOCK_FILE
from .setup import RunComplete, TrainOptions, refuse_stored_files
from .threads import plan_threads
from .trainer import Trainer


def run_plan(opts, dist: DistInfo = SINGLE) -> dict[str, Any]:
    """Plan and train (the function each spawned process runs)."""
    from .setup import make_plan

    plan = make_plan(opts, world=dist.world // opts.context_parallel)
    return Trainer(plan, dist, progress=opts.progress, shard=opts.shard,
                   context_parallel=opts.context_parallel, threads=opts.threads).run()


def _unsaved_run(d: Path, resuming: bool = False) -> bool:
    """Whether ``d`` holds a run stopped before its first checkpoint: a metrics log without the
    end marker, and no complete checkpoint (counting those a killed save left under temporary
    names, which a resume adopts). ``resuming`` (``--resume d``): a run killed after it locked the
    directory (``run.lock``) but before its first log line counts too."""
    if latest_checkpoint(d / "checkpoints") is not None:
        return False
    if not (d / METRICS_FILE).is_file():
        return resuming and (d / LOCK_FILE).is_file()
    return not run_finished(d)


def restart_unsaved(opts: TrainOptions) -> tuple[TrainOptions, str | None]:
    """The options that start again a run stopped before its first checkpoint, and the line
    that says so; ``(opts, None)`` when ``--resume`` / ``--out`` name no such run.

    ``--resume DIR`` restarts it from step 0 in DIR with the run's ``spec.toml`` (or SPEC):
    with nothing saved, step 0 is where the run is, and the same spec and seed redo it exactly.
    ``--out DIR`` for a fresh run may reuse DIR (only a complete checkpoint or a finished run
    makes a directory hold a run). Everything else is left to `make_plan`'s checks."""
    if opts.run_dir_checked:
        return opts, None
    note = None
    if opts.resume:
        d = Path(opts.resume).expanduser()
        if d.name == "checkpoints" and not (d / METRICS_FILE).exists():
            d = d.parent
        if not (_unsaved_run(d, resuming=True) and ((d / "spec.toml").is_file() or opts.spec)):
            return opts, None
        note = (f"{d} holds no checkpoint (the run stopped before its first one): starting it "
                "again from step 0")
        spec = opts.spec
        if spec is None:  # the run's own spec may not choose the local files it reads either
            from ..spec import load_spec

            path = str(d / "spec.toml")
            spec = load_spec(path)  # resolved once, here: the plan uses it as it is
            refuse_stored_files(spec, path, str(d), None)
        opts = dataclasses.replace(opts, resume=None, spec=spec)
        if opts.out is None or Path(opts.out).expanduser().resolve() == d.resolve():
            return dataclasses.replace(opts, out=str(d), run_dir_checked=True), note
    if opts.out and _unsaved_run(Path(opts.out).expanduser()):
        note = note or (f"--out {opts.out} held a run stopped before its first checkpoint: "
                        "starting the new run there")
        return dataclasses.replace(opts, run_dir_checked=True), note
    return opts, note


def prepare(opts: TrainOptions,
            check: Callable[[TrainOptions], None] | None = None) -> TrainOptions:
    """``opts`` with the run directory read, once (module docstring): an unsaved run restarted
    (`restart_unsaved`: ``spec`` resolved, ``note`` set), else the checkpoint ``resume`` names
    opened (``checkpoint``). ``check(opts)`` (the launch's own checks) runs before the
    checkpoint is read. Options prepared already are only checked."""
    if opts.prepared:
        if check is not None:
            check(opts)
        return opts
    opts, note = restart_unsaved(opts)
    if check is not None:
        check(opts)
    ckpt = checked_load_checkpoint(opts.resume) if opts.resume else None
    return dataclasses.replace(opts, prepared=True, checkpoint=ckpt, note=note)


def train(opts, nproc: int = 1, on_step: Callable[[Trainer], None] | None = None) -> dict[str, Any]:
    """Train as ``atlas train`` does: check everything, then run in 1 or ``nproc`` processes.

    Under ``torchrun`` (``WORLD_SIZE`` > 1 in the environment) this process is one rank.
    ``--resume`` of a run that already finished its steps trains nothing: one line on stderr
    says the run is complete, and its result is returned (`setup.RunComplete`)."""
    configure_allocator()  # bounded resident memory on glibc (atlas_core.allocator)
    try:
        return _train(opts, nproc, on_step)
    except RunComplete as done:
        env = from_env()
        done.result["rank"] = env.rank if env is not None else 0
        if done.result["rank"] == 0:
            print(done.line, file=sys.stderr)
        return done.result


def _train(opts, nproc: int, on_step: Callable[[Trainer], None] | None) -> dict[str, Any]:
    from . import data_parallel as distributed
    from .setup import make_plan, worker_options

    env = distributed.from_env()
    if env is None:
        if nproc < 1:
            raise ValueError(f"--nproc {nproc} must be >= 1")
        if opts.context_parallel > 1 and nproc == 1:  # one process per slice of each sequence
            nproc = opts.context_parallel
    world = env.world if env is not None else nproc

    def check(o: TrainOptions) -> None:
        distributed.check_launch(o.shard, o.context_parallel, world, o.resume)

    opts = prepare(opts, check)
    note = opts.note
    if env is not None:
        # Every rank checks the inputs before the rendezvous (init returns only when all ranks
        # have joined, so no rank can see a directory that rank 0 already started writing);
        # then all ranks take rank 0's choice of run directory.
        plan = make_plan(opts, world=env.world // opts.context_parallel)
        distributed.check_context_model(plan, opts.context_parallel)
        if note and env.is_main:
            print(note, file=sys.stderr)
        distributed.init(env, plan.device)
        clean = False  # every rank reaches the end together only on a normal or interrupted exit
        try:
            chosen = [str(plan.run_dir)]
            torch.distributed.broadcast_object_list(chosen, src=0)
            plan.run_dir = Path(chosen[0])
            result = Trainer(plan, env, on_step, progress=opts.progress, shard=opts.shard,
                             context_parallel=opts.context_parallel).run()
            clean = True
            return result
        except TrainingInterrupted:
            clean = True
            raise
        finally:
            distributed.shutdown(clean)
    plan = make_plan(opts, world=nproc // opts.context_parallel)  # every input error surfaces here
    distributed.check_context_model(plan, opts.context_parallel)
    if note:
        print(note, file=sys.stderr)
    if nproc == 1:
        return Trainer(plan, SINGLE, on_step, progress=opts.progress).run()
    if plan.device.startswith("cuda") and torch.cuda.device_count() < nproc:
        raise ValueError(
            f"--nproc {nproc} on CUDA needs {nproc} GPUs (one per process), this machine has "
            f"{torch.cuda.device_count()}; lower --nproc or use --device cpu"
        )
    if on_step is not None:
        raise ValueError("on_step callbacks run in one process only (nproc=1)")
    # one choice of threads for all the workers, made before they start (and load the machine)
    chosen = plan_threads(plan.train.threads, processes=nproc)
    return distributed.spawn(run_plan, dataclasses.replace(worker_options(opts, plan), threads=chosen),
                             nproc, plan.device, threads=chosen[0])
