"""Where the benchmark runs, and its clock: ``cpu`` or ``cuda``, and a timer that waits for the
device.

`resolve_device` turns ``"auto"`` / ``"cpu"`` / ``"cuda"`` into a `torch.device` (``auto``: CUDA
when available, else the CPU). `use_device` makes a device the benchmark's current one
(`current_device`) for the code that has no device argument of its own: a subject's equivalence
check (`Subject.check`) and its default `Subject.setup` build their rule, inputs and modules there.

CUDA runs asynchronously: an operator returns once its kernel is queued. `clock` is the one clock
of every timed region of the benchmark: it calls ``torch.cuda.synchronize`` on a CUDA device
before reading ``time.perf_counter``, so the region's time ends when its kernels have finished and
starts after the work queued before it. On the CPU it is ``time.perf_counter`` alone.
"""

from __future__ import annotations

import contextlib
import contextvars
import platform
import time
from typing import Any, Iterator

import torch

DEVICES = ("auto", "cpu", "cuda")

_current: contextvars.ContextVar[torch.device] = contextvars.ContextVar(
    "atlas_bench_device", default=torch.device("cpu"))


class DeviceError(ValueError):
    """A device the benchmark cannot run on: ``value``, ``reason`` and ``fix`` (`resolve_device`)."""

    def __init__(self, value: str, reason: str, fix: str) -> None:
        self.value, self.reason, self.fix = value, reason, fix
        super().__init__(f"device={value!r}: {reason}; {fix}")


def resolve_device(name: str | torch.device | None, option: str = "device") -> torch.device:
    """``"auto"`` (CUDA when available, else the CPU), ``"cpu"`` or ``"cuda"`` (``"cuda:N"``) as a
    `torch.device`. `DeviceError` (a ValueError) naming the value and the fix for anything else,
    and for CUDA on a machine or torch build without it; ``option`` is how the fix names the
    setting (``"--device"`` on the command line)."""
    if isinstance(name, torch.device):
        name = str(name)
    name = (name or "cpu").strip().lower()
    use = (lambda v: f"{option} {v}") if option.startswith("-") else (lambda v: f"{option}={v!r}")
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if name == "cpu":
        return torch.device("cpu")
    if name == "cuda" or name.startswith("cuda:"):
        if not torch.cuda.is_available():
            raise DeviceError(name, "CUDA is not available on this machine or in this torch build "
                              f"(torch {torch.__version__})", f"use {use('cpu')}, or {use('auto')} "
                              "(CUDA when available, else the CPU)")
        try:
            dev = torch.device(name)
        except RuntimeError:
            dev = None
        if dev is None or (dev.index or 0) >= torch.cuda.device_count():
            raise DeviceError(name, f"this machine has {torch.cuda.device_count()} CUDA device(s)",
                              f"use {use('cuda')} (the first) or {use('cuda:N')} with N below that count")
        return dev
    raise DeviceError(name, "not a benchmark device", f"use {' or '.join(use(d) for d in DEVICES)}")


def is_cuda(device: Any) -> bool:
    return device is not None and torch.device(device).type == "cuda"


def synchronize(device: Any) -> None:
    """Wait for every kernel queued on ``device`` (a no-op on the CPU)."""
    if is_cuda(device):
        torch.cuda.synchronize(device)


def clock(device: Any = None) -> float:
    """Seconds (``time.perf_counter``), read after `synchronize` on a CUDA device. A timed region
    is ``t0 = clock(d); work(); clock(d) - t0``."""
    synchronize(device)
    return time.perf_counter()


def current_device() -> torch.device:
    """The device of the running benchmark (`use_device`; the CPU outside one)."""
    return _current.get()


@contextlib.contextmanager
def use_device(device: Any) -> Iterator[torch.device]:
    """Make ``device`` the benchmark's current device inside the block."""
    dev = torch.device(device)
    token = _current.set(dev)
    try:
        yield dev
    finally:
        _current.reset(token)


def cpu_name() -> str:
    name = platform.processor() or platform.machine()
    try:
        with open("/proc/cpuinfo") as fh:
            for line in fh:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return name


def device_info(device: Any) -> dict[str, Any]:
    """``{"device": "cuda:0", "device_name": "NVIDIA H100 ...", ...}`` (the CPU: its model name);
    with CUDA also the memory and the versions that decide kernel behaviour."""
    dev = torch.device(device)
    if dev.type != "cuda":
        return {"device": "cpu", "device_name": cpu_name()}
    index = dev.index if dev.index is not None else torch.cuda.current_device()
    props = torch.cuda.get_device_properties(index)
    return {"device": f"cuda:{index}", "device_name": torch.cuda.get_device_name(index),
            "device_memory_gib": round(props.total_memory / 1024 ** 3, 1),
            "cuda": torch.version.cuda,
            "tf32_matmul": bool(torch.backends.cuda.matmul.allow_tf32)}
