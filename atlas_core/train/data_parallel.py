"""Data-parallel training through ``torch.distributed``: N processes, one model (or shard) each.

Every rank draws the same *global* batch from the same seeded generator and keeps its own slice of
rows (rank r takes rows ``r * B / N .. (r + 1) * B / N``), so the data of an N-process run is the
data of a 1-process run with the same ``batch_size``. The loss of a rank is its summed
cross-entropy divided by the *global* number of counted targets; the engine averages gradients over
the N ranks, so the trainer back-propagates N times that loss and the averaged gradient is the
1-process gradient up to the order of floating-point sums. Gradient clipping and AdamW then run
identically on every rank (on every shard with FSDP).

Engines (`wrap`, chosen with ``atlas train --shard``):

- ``ddp`` (default): `torch.nn.parallel.DistributedDataParallel`; every rank holds the whole model
  and optimiser state, gradients are all-reduced in buckets overlapped with the backward;
- ``fsdp``: FSDP2 (`torch.distributed.fsdp.fully_shard`) on every block and on the root: each rank
  holds 1/N of every parameter, gradient and optimiser state, parameters are all-gathered around
  each block's forward and backward and gradients reduce-scattered. A checkpoint is always the
  full, unsharded model (`full_state`: gathered on every rank, written by rank 0), so it loads in
  one process; a run written under FSDP resumes under DDP (``--shard ddp``).

Launch: `spawn` starts N local processes (``torch.multiprocessing``, start method "spawn") that
rendezvous over TCP on 127.0.0.1; under ``torchrun`` the environment (``RANK``, ``WORLD_SIZE``,
``MASTER_ADDR``, ``MASTER_PORT``) is used instead (`from_env`). Backend: gloo on the CPU, NCCL on
CUDA (one GPU per rank, ``LOCAL_RANK``). Only rank 0 writes checkpoints, logs and plots.

Teardown (`shutdown`): on the normal path every rank meets at a barrier (no rank still talks to
another), then destroys the process group; on an error or Ctrl-C path the group is destroyed
without a barrier (a peer may be stuck in another collective and must not be waited for).
"""

from __future__ import annotations

import os
import queue as queue_mod
import socket
import traceback
from dataclasses import dataclass
from typing import Any, Callable

import torch
import torch.distributed as dist

from .errors import DistributedError, TrainingInterrupted


@dataclass(frozen=True)
class DistInfo:
    rank: int = 0
    world: int = 1
    local_rank: int = 0

    @property
    def is_main(self) -> bool:
        return self.rank == 0

    @property
    def active(self) -> bool:
        return self.world > 1


SINGLE = DistInfo()


def from_env() -> DistInfo | None:
    """The process's place in a ``torchrun`` launch, or None when not launched by one."""
    if "RANK" not in os.environ or "WORLD_SIZE" not in os.environ:
        return None
    world = int(os.environ["WORLD_SIZE"])
    if world <= 1:
        return None
    return DistInfo(int(os.environ["RANK"]), world, int(os.environ.get("LOCAL_RANK", "0")))


def backend_for(device: str) -> str:
    return "nccl" if device.startswith("cuda") else "gloo"


def init(info: DistInfo, device: str, init_method: str = "env://") -> None:
    """Join the process group (no-op for a single process or when already joined)."""
    if not info.active or dist.is_initialized():
        return
    if device.startswith("cuda"):
        torch.cuda.set_device(info.local_rank)
    dist.init_process_group(
        backend_for(device), init_method=init_method, rank=info.rank, world_size=info.world
    )


def shutdown(clean: bool = True) -> None:
    """Leave the process group. ``clean``: the normal exit, where every rank reaches this call,
    so a barrier first makes sure no rank still exchanges data with another; on an error path
    (``clean=False``) the group is destroyed at once."""
    if not dist.is_initialized():
        return
    try:
        if clean and dist.get_world_size() > 1:
            dist.barrier()
    finally:
        dist.destroy_process_group()


SHARD_MODES = ("ddp", "fsdp")


def check_shard(mode: str, world: int) -> None:
    """Refuse an engine name this module does not know, or FSDP with a single process."""
    if mode not in SHARD_MODES:
        raise ValueError(f"--shard {mode!r} is not an engine; use one of {', '.join(SHARD_MODES)}")
    if mode == "fsdp" and world < 2:
        raise ValueError("--shard fsdp splits the model over processes and this run has one; "
                         "add --nproc N (N >= 2) or launch it with torchrun --nproc_per_node N")


def check_launch(mode: str, context_parallel: int, world: int, resume: Any = None) -> None:
    """`check_shard`, refuse resuming under FSDP (a checkpoint is the full model: resume it with
    DDP), and refuse a context-parallel launch these processes cannot run: each sequence is split
    over all the processes (R = the number of processes), with DDP."""
    check_shard(mode, world)
    if mode == "fsdp" and resume:
        raise ValueError(f"--shard fsdp does not resume runs; resume {resume} with --shard ddp "
                         "(its checkpoints hold the full model and optimiser state)")
    if isinstance(context_parallel, bool) or not isinstance(context_parallel, int) or context_parallel < 1:
        raise ValueError(f"--context-parallel {context_parallel!r} must be a whole number >= 1")
    if context_parallel == 1:
        return
    if world != context_parallel:
        raise ValueError(
            f"--context-parallel {context_parallel} splits each sequence over all the processes, "
            f"and this run has {world}; use --nproc {context_parallel} (or leave --nproc out) or "
            f"torchrun --nproc_per_node {context_parallel} (data and context parallelism together "
            "are not supported)")
    if mode != "ddp":
        raise ValueError(f"--context-parallel runs with --shard ddp, not --shard {mode}")


def check_context_model(plan: Any, context_parallel: int) -> None:
    """Refuse a model or sequence length that context parallelism cannot split."""
    if context_parallel > 1:
        from ..distributed.lm import check_model

        check_model(plan.spec, context_parallel, plan.task.seq_len)


def all_reduce_sum(t: torch.Tensor, info: DistInfo) -> torch.Tensor:
    """Sum ``t`` over ranks, in place (returned for chaining); identity for one process."""
    if info.active:
        dist.all_reduce(t, op=dist.ReduceOp.SUM)
    return t


# -- engines ---------------------------------------------------------------------------------------
def wrap(model: Any, info: DistInfo, mode: str, device: str) -> torch.nn.Module:
    """The module the training step calls: ``model`` itself for one process, else DDP around it
    (rank 0's parameters are broadcast to every rank) or, with ``mode = "fsdp"``, ``model`` (a
    `MemoryLM`) sharded in place by FSDP2 (each of its `fsdp_units`, then the root; ``step`` is
    registered so that decoding through `MemoryLM.generate` gathers the parameters as ``forward``
    does)."""
    if not info.active:
        return model
    if mode == "ddp":
        from torch.nn.parallel import DistributedDataParallel

        ids = [torch.device(device).index or 0] if device.startswith("cuda") else None
        return DistributedDataParallel(model, device_ids=ids)
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard, register_fsdp_forward_method

    broadcast_module(model)  # the same initial weights on every rank before each takes its shard
    mesh = init_device_mesh("cuda" if device.startswith("cuda") else "cpu", (info.world,))
    for block in model.fsdp_units():  # declared by the model's class (`MemoryLM.fsdp_units`)
        fully_shard(block, mesh=mesh)
    fully_shard(model, mesh=mesh)
    register_fsdp_forward_method(model, "step")
    return model


def engine(model: torch.nn.Module, info: DistInfo, mode: str, device: str,
           context_parallel: int = 1) -> torch.nn.Module:
    """The module a training step calls with N processes: with ``context_parallel`` > 1 the
    memory layers first run across the ranks (`atlas_core.distributed.lm.enable`), then `wrap`."""
    if context_parallel > 1:
        from ..distributed.lm import enable

        enable(model, dist.new_group(list(range(info.world))))
    return wrap(model, info, mode, device)


def no_sync(engine: torch.nn.Module, model: torch.nn.Module, mode: str, info: DistInfo):
    """A callable returning the context in which a backward leaves the gradients unsynchronised
    across ranks (gradient accumulation: every micro-batch but the last), or None for one
    process: DDP's ``no_sync()`` (through a torch.compile wrapper), or FSDP2's
    ``set_requires_gradient_sync(False)`` for the duration."""
    if not info.active:
        return None
    if mode == "fsdp":
        import contextlib

        @contextlib.contextmanager
        def unsynced():
            model.set_requires_gradient_sync(False)
            try:
                yield
            finally:
                model.set_requires_gradient_sync(True)

        return unsynced
    ddp = getattr(engine, "_orig_mod", engine)  # torch.compile's wrapper keeps the module there
    return ddp.no_sync


def rank_part(info: DistInfo, context_parallel: int, rows: torch.Tensor) -> torch.Tensor:
    """This rank's part of a global batch: its rows (`shard`), or with ``context_parallel`` > 1
    its time slice of every row."""
    if context_parallel > 1:
        from ..distributed.lm import time_slice

        return time_slice(rows, info.rank, info.world)
    return shard(rows, info)


def broadcast_module(model: torch.nn.Module) -> None:
    """Rank 0's parameters and buffers on every rank."""
    with torch.no_grad():
        for t in list(model.parameters()) + list(model.buffers()):
            dist.broadcast(t.data, src=0)


def full_value(t: Any) -> Any:
    """A plain tensor for a (possibly sharded) tensor: collective under FSDP, every rank calls."""
    from torch.distributed.tensor import DTensor

    return t.full_tensor() if isinstance(t, DTensor) else t


class _FullModel:
    """What `save_checkpoint` needs of a model: ``state_dict()``, here the full one."""

    def __init__(self, tensors: dict[str, torch.Tensor]) -> None:
        self.tensors = tensors

    def state_dict(self) -> dict[str, torch.Tensor]:
        return self.tensors


class _FullOptimizer:
    """An optimiser seen through its full (gathered) state: ``param_groups`` and ``state_dict``."""

    def __init__(self, optimizer: torch.optim.Optimizer) -> None:
        self.param_groups = optimizer.param_groups
        sd = optimizer.state_dict()
        sd["state"] = {i: {k: full_value(v) for k, v in st.items()} for i, st in sd["state"].items()}
        self._sd = sd

    def state_dict(self) -> dict[str, Any]:
        return self._sd


def full_state(model: torch.nn.Module, optimizer: torch.optim.Optimizer, mode: str, info: DistInfo):
    """``(model view, optimiser view)`` holding the full, unsharded state for a checkpoint.

    DDP and a single process: the objects themselves (every rank holds everything). FSDP: every
    rank must call (the shards are all-gathered); rank 0's views hold the full tensors on the CPU
    with the names of the unwrapped model, the other ranks' views are for the collective only."""
    if not info.active or mode != "fsdp":
        return model, optimizer
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

    tensors = get_model_state_dict(
        model, options=StateDictOptions(full_state_dict=True, cpu_offload=True))
    plain = {name: tensors[name] for name in model.state_dict()} if info.is_main else {}
    return _FullModel(plain), _FullOptimizer(optimizer)


def any_rank(flag: bool, info: DistInfo, device: str) -> bool:
    """True on every rank when ``flag`` is true on any (e.g. a Ctrl-C seen by one process)."""
    if not info.active:
        return flag
    t = torch.tensor([1.0 if flag else 0.0], device=device)
    dist.all_reduce(t, op=dist.ReduceOp.MAX)
    return bool(t.item() > 0)


def shard(rows: torch.Tensor, info: DistInfo) -> torch.Tensor:
    """This rank's slice of a global batch ``[B, ...]`` (B divisible by the world size)."""
    if not info.active:
        return rows
    per = rows.shape[0] // info.world
    return rows[info.rank * per : (info.rank + 1) * per]


# -- spawning --------------------------------------------------------------------------------------
def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _worker(rank: int, world: int, port: int, device: str, threads: int,
            fn: Callable, payload: Any, results) -> None:
    """Entry point of a spawned process: join the group, run ``fn(payload, info)``, report."""
    info = DistInfo(rank, world, rank)
    torch.set_num_threads(threads)
    kind = "ok"
    try:
        init(info, device, init_method=f"tcp://127.0.0.1:{port}")
        value = fn(payload, info)
    except KeyboardInterrupt:
        kind, value = "error", ("KeyboardInterrupt", "stopped by a second Ctrl-C", "")
    except BaseException as exc:  # noqa: BLE001 - reported to the parent, which re-raises
        kind, value = "error", (type(exc).__name__, str(exc), traceback.format_exc())
        if isinstance(exc, TrainingInterrupted):
            kind, value = "interrupted", (exc.step, str(exc.checkpoint) if exc.checkpoint else None)
    finally:
        shutdown(clean=kind in ("ok", "interrupted"))
    results.put((rank, kind, value))


def spawn(fn: Callable, payload: Any, nproc: int, device: str, threads: int | None = None) -> Any:
    """Run ``fn(payload, DistInfo)`` in ``nproc`` processes, each with ``threads`` intra-op
    threads (default: the cores divided among them); returns rank 0's value.

    ``fn`` must be a module-level function and ``payload`` picklable. A failed worker is raised
    here as `DistributedError` with the worker's message; an interrupted run re-raises
    `TrainingInterrupted` (rank 0 saved the checkpoint). Ctrl-C in the parent is ignored while
    the workers, which see it too, stop at the end of their step and save."""
    import torch.multiprocessing as mp

    ctx = mp.get_context("spawn")
    results = ctx.SimpleQueue()
    threads = threads or max(1, (os.cpu_count() or 1) // nproc)
    port = free_port()
    procs = mp.start_processes(
        _worker, args=(nproc, port, device, threads, fn, payload, results),
        nprocs=nproc, join=False, start_method="spawn",
    )
    crash: BaseException | None = None
    reports: dict[int, tuple[str, Any]] = {}

    def drain() -> None:
        while not results.empty():
            rank, kind, value = results.get()
            reports[rank] = (kind, value)

    while True:
        try:
            done = procs.join(timeout=0.5)
            drain()
            if done:
                break
            if any(kind == "error" for kind, _ in reports.values()):
                # A failed rank leaves the others waiting in a collective: stop them now
                # rather than after the process group's timeout.
                for proc in procs.processes:
                    if proc.is_alive():
                        proc.terminate()
                break
        except KeyboardInterrupt:
            continue
        except Exception as exc:  # noqa: BLE001 - a worker died; its report (if any) says why
            crash = exc
            break
    try:
        drain()
    except (EOFError, OSError, queue_mod.Empty):
        pass
    errors = [(r, v) for r, (k, v) in sorted(reports.items()) if k == "error"]
    if errors:
        rank, (name, message, tb) = errors[0]
        if os.environ.get("ATLAS_DEBUG"):
            message = f"{message}\n{tb}"
        raise DistributedError(f"rank {rank}: {name}: {message}")
    if crash is not None or 0 not in reports:
        raise DistributedError(f"a worker process died: {crash}")
    kind, value = reports[0]
    if kind == "interrupted":
        step, path = value
        raise TrainingInterrupted(step, path)
    return value
