"""Data-parallel training through ``torch.distributed``: N processes, one model replica each.

Every rank draws the same *global* batch from the same seeded generator and keeps its own slice of
rows (rank r takes rows ``r * B / N .. (r + 1) * B / N``), so the data of an N-process run is the
data of a 1-process run with the same ``batch_size``. The loss of a rank is its summed
cross-entropy divided by the *global* number of counted targets, and the gradients are summed
across ranks (one all-reduce of a flat buffer per step): the update is the 1-process update up to
the order of floating-point sums. Gradient clipping and AdamW then run identically on every rank.
(This is what DistributedDataParallel does with bucketed, overlapped all-reduces; the explicit
form keeps the equivalence visible and costs nothing at the sizes that train on a CPU.)

Launch: `spawn` starts N local processes (``torch.multiprocessing``, start method "spawn") that
rendezvous over TCP on 127.0.0.1; under ``torchrun`` the environment (``RANK``, ``WORLD_SIZE``,
``MASTER_ADDR``, ``MASTER_PORT``) is used instead (`from_env`). Backend: gloo on the CPU, NCCL on
CUDA (one GPU per rank, ``LOCAL_RANK``). Only rank 0 writes checkpoints, logs and plots.
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

from ..errors import AtlasError


class DistributedError(AtlasError, RuntimeError):
    """A worker process failed; the message is the worker's own error line."""


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


def shutdown() -> None:
    if dist.is_initialized():
        dist.destroy_process_group()


# -- collectives used by the trainer ---------------------------------------------------------------
def all_reduce_sum(t: torch.Tensor, info: DistInfo) -> torch.Tensor:
    """Sum ``t`` over ranks, in place (returned for chaining); identity for one process."""
    if info.active:
        dist.all_reduce(t, op=dist.ReduceOp.SUM)
    return t


def all_reduce_grads(params: list[torch.nn.Parameter], info: DistInfo) -> None:
    """Sum the gradients of ``params`` over ranks with one flat all-reduce."""
    if not info.active:
        return
    grads = [p.grad for p in params if p.grad is not None]
    if not grads:
        return
    flat = torch.cat([g.reshape(-1) for g in grads])
    dist.all_reduce(flat, op=dist.ReduceOp.SUM)
    offset = 0
    for g in grads:
        n = g.numel()
        g.copy_(flat[offset : offset + n].view_as(g))
        offset += n


def broadcast_model(model: torch.nn.Module, info: DistInfo) -> None:
    """Rank 0's parameters and buffers on every rank (the same seed already agrees; this makes
    it true whatever the initialiser does)."""
    if not info.active:
        return
    with torch.no_grad():
        for t in list(model.parameters()) + list(model.buffers()):
            dist.broadcast(t.data, src=0)


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
        from .trainer import TrainingInterrupted

        if isinstance(exc, TrainingInterrupted):
            kind, value = "interrupted", (exc.step, str(exc.checkpoint) if exc.checkpoint else None)
    finally:
        shutdown()
    results.put((rank, kind, value))


def spawn(fn: Callable, payload: Any, nproc: int, device: str) -> Any:
    """Run ``fn(payload, DistInfo)`` in ``nproc`` processes; returns rank 0's value.

    ``fn`` must be a module-level function and ``payload`` picklable. A failed worker is raised
    here as `DistributedError` with the worker's message; an interrupted run re-raises
    `TrainingInterrupted` (rank 0 saved the checkpoint). Ctrl-C in the parent is ignored while
    the workers, which see it too, stop at the end of their step and save."""
    import torch.multiprocessing as mp

    from .trainer import TrainingInterrupted

    ctx = mp.get_context("spawn")
    results = ctx.SimpleQueue()
    threads = max(1, (os.cpu_count() or 1) // nproc)
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
