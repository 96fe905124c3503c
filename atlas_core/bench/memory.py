"""Peak memory of a computation: CUDA's allocator counter on a GPU, live tensor bytes on the CPU.

`peak_bytes` picks by device. On CUDA it is the caching allocator's own counter: the peak of
``torch.cuda.max_memory_allocated`` over the call (after ``torch.cuda.reset_peak_memory_stats``)
minus what was allocated before it, synchronised on both sides (it counts each block as the
allocator rounds it). The CPU allocator keeps no such counter, and the
process's resident set (``ru_maxrss``) mixes in the Python heap, the allocator's caching and
pages glibc keeps after a free. `LiveTensorBytes` counts what the computation itself holds instead: a
`TorchDispatchMode` sees every aten operator's outputs (forward and backward: the autograd engine
runs CPU work on the calling thread with the mode active). Each new storage adds its ``nbytes``
to a live total; a ``weakref.finalize`` on every tensor that refers to it lowers a per-storage
count, and the bytes leave the total when the last such tensor dies. PyTorch keeps a tensor's
Python object alive while C++ (the autograd graph's saved tensors) still holds it, so a tensor saved
for backward stays counted until the graph frees it. The peak is the largest live total seen.

What it counts: every tensor storage created while the mode is active (outputs, saved activations,
gradients). What it does not: tensors that existed before (inputs, parameters), memory that
does not pass through aten operators (Python objects, a C++ extension's private buffers),
allocator fragmentation. Views share their base's storage and are counted once; in-place ops add
nothing. The mode adds a few microseconds per operator, so time and memory are measured in
separate runs.

What users meet is the process's resident set, which can be far above the live tensors: on glibc
the heap keeps freed memory resident, fragmented between longer-lived tensors (docs/benchmarks.md,
"Resident memory and live tensors"; `atlas_core.allocator` bounds it). `ResidentPeak` measures it
from outside the tensors: the peak resident set during a block minus the resident set just before
(Linux: ``VmHWM`` of /proc/self/status after resetting it through /proc/self/clear_refs; where the
reset is refused, a thread that samples ``VmRSS`` every few milliseconds). It includes everything
the process touched: code pages read for the first time, the Python heap, the allocator's free
memory. Measure it in a fresh process, one measurement per process, beside `peak_tensor_bytes` in
another (the probe's own bookkeeping would be counted): ``benchmarks/bench_resident.py`` does both.
"""

from __future__ import annotations

import threading
import weakref
from typing import Any, Callable

import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_leaves


class LiveTensorBytes(TorchDispatchMode):
    """Tracks the bytes of live tensor storages created under the mode (see module docstring)."""

    def __init__(self) -> None:
        super().__init__()
        self.live = 0
        self.peak = 0
        self._refs: dict[tuple[str, int], list[int]] = {}  # storage key -> [tensor count, nbytes]

    def _release(self, key: tuple[str, int]) -> None:
        entry = self._refs.get(key)
        if entry is None:
            return
        entry[0] -= 1
        if entry[0] == 0:
            del self._refs[key]
            self.live -= entry[1]

    def _track(self, t: torch.Tensor) -> None:
        try:
            storage = t.untyped_storage()
        except (RuntimeError, NotImplementedError):  # tensors without storage (e.g. sparse, meta)
            return
        key = (str(t.device), storage.data_ptr())
        if key[1] == 0:
            return  # empty tensors
        entry = self._refs.get(key)
        if entry is None:
            entry = self._refs[key] = [0, storage.nbytes()]
            self.live += entry[1]
            self.peak = max(self.peak, self.live)
        entry[0] += 1
        weakref.finalize(t, self._release, key)

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        for t in tree_leaves(out):
            if isinstance(t, torch.Tensor):
                self._track(t)
        return out


def peak_tensor_bytes(fn: Callable[[], Any]) -> int:
    """Run ``fn()`` under `LiveTensorBytes` and return the peak of live tensor bytes it created.

    The result of ``fn`` is dropped inside the measurement, so everything it allocated is freed
    again (what it returns still counts towards the peak while it was alive)."""
    with LiveTensorBytes() as probe:
        out = fn()
        del out
    return probe.peak


def cuda_peak_bytes(fn: Callable[[], Any], device: Any) -> int:
    """The peak of bytes the CUDA caching allocator had allocated on ``device`` during ``fn()``,
    minus what was allocated before the call (tensors that already existed: inputs, parameters).
    The result of ``fn`` is dropped inside the measurement, as in `peak_tensor_bytes`."""
    torch.cuda.synchronize(device)
    torch.cuda.reset_peak_memory_stats(device)
    before = torch.cuda.memory_allocated(device)
    out = fn()
    del out
    torch.cuda.synchronize(device)
    return max(0, torch.cuda.max_memory_allocated(device) - before)


def peak_bytes(fn: Callable[[], Any], device: Any = None) -> int:
    """Peak bytes ``fn()`` allocates: `cuda_peak_bytes` on a CUDA device, else (the CPU, None)
    `peak_tensor_bytes`."""
    if device is not None and torch.device(device).type == "cuda":
        return cuda_peak_bytes(fn, device)
    return peak_tensor_bytes(fn)


def _status_bytes(key: bytes) -> int | None:
    """A ``kB`` line of /proc/self/status in bytes (``VmRSS``, ``VmHWM``, ``RssAnon``), None if absent."""
    try:
        with open("/proc/self/status", "rb") as f:
            for line in f:
                if line.startswith(key + b":"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return None


def rss_bytes() -> int | None:
    """The process's resident set now (``VmRSS``), None where /proc/self/status is missing."""
    return _status_bytes(b"VmRSS")


class ResidentPeak:
    """Peak resident-set growth of the process over a ``with`` block (see module docstring):
    ``growth`` = peak ``VmRSS`` during the block minus ``VmRSS`` at its start, in bytes; ``method``
    says how the peak was read (``"VmHWM"``, ``"sampled"``, or ``"unavailable"``: growth None)."""

    def __init__(self, interval: float = 0.005, use_hwm: bool = True) -> None:
        self.interval, self.use_hwm = interval, use_hwm
        self.before: int | None = None
        self.peak: int | None = None
        self.growth: int | None = None
        self.method = "unavailable"
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def _sample(self) -> None:
        while not self._stop.wait(self.interval):
            now = rss_bytes() or 0
            self.peak = max(self.peak or 0, now)

    def __enter__(self) -> "ResidentPeak":
        self.before = rss_bytes()
        if self.before is None:
            return self
        try:  # "5" resets the high-water mark to the current resident set (Linux >= 4.0)
            if not self.use_hwm:
                raise OSError("sampling asked for")
            with open("/proc/self/clear_refs", "w") as f:
                f.write("5")
            self.method = "VmHWM"
        except OSError:
            self.method = "sampled"
            self.peak = self.before
            self._thread = threading.Thread(target=self._sample, name="resident-peak", daemon=True)
            self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        if self.method == "VmHWM":
            self.peak = _status_bytes(b"VmHWM")
        elif self._thread is not None:
            self._stop.set()
            self._thread.join()
            self.peak = max(self.peak or 0, rss_bytes() or 0)
        if self.before is not None and self.peak is not None:
            self.growth = max(0, self.peak - self.before)


def resident_growth_bytes(fn: Callable[[], Any]) -> int | None:
    """Run ``fn()`` and return how far it pushed the process's resident set above where it was
    (`ResidentPeak`); None where the resident set cannot be read. The result of ``fn`` is dropped
    inside the measurement, as in `peak_tensor_bytes`."""
    with ResidentPeak() as probe:
        out = fn()
        del out
    return probe.growth
