"""Resident memory on glibc: bound the heap's freed-but-resident memory (docs/benchmarks.md,
"Resident memory and live tensors").

Why. PyTorch's CPU tensors come from ``posix_memalign``, so on Linux glibc's malloc decides how much
of the memory a computation freed stays in the process. A chunked strategy on a deep memory
(``atlas_muon:atlas_parallel``: per-token weights, momenta and Newton-Schulz iterates of one chunk,
2-8 MiB each, allocated and freed a few hundred times per chunk, forward, recomputation and
backward) meets glibc's worst case: small tensors that outlive their chunk (the carry, its
gradients, the chunk inputs' gradients that autograd buffers until the last chunk) are carved out
of the holes the big transients left, so the next chunk's 8 MiB tensors no longer fit and the heap
grows at its top. Measured on Atlas fwd+bwd (B 2, H 4, D 64, one thread): heap free at the peak 878
MiB against 296 MiB in use at T = 1,024; resident growth 2,618 MiB against a live-tensor peak of
788 MiB at T = 4,096. The freed memory stays resident because glibc returns only the top of the
heap (and, with its dynamic thresholds, only when more than 2x the largest freed tensor is free
there).

Returning memory to the kernel is what costs on the CPU: every page given back is faulted in
again (zeroed) when reused. Sending the big tensors to ``mmap`` (``M_MMAP_THRESHOLD`` = 1 MiB)
brings Atlas' resident growth down to its live tensors plus a constant, but cost the same fwd+bwd
70-80% more CPU time (4.5 million page faults at T = 256 instead of 0.5-0.7 million: this
machine's page faults cost about 3 us each); trimming whenever glibc's free bytes exceed a budget
cost 28% at T = 1,024 (trimmed pages stay counted as free, so it trimmed again at every look).
Neither is a default.

What `configure` does instead (once per process, where the process starts: the ``atlas`` CLI,
`atlas_core.train.launch.train`):

1. fixes glibc's thresholds, ``M_MMAP_THRESHOLD`` = 32 MiB and ``M_TRIM_THRESHOLD`` = 1 GiB
   (``mallopt``; setting them turns off glibc's dynamic adjustment): tensors up to 32 MiB are
   served from the heap and ``free`` no longer hands the heap's top back and forth, which by itself
   saves most of the page faults glibc's default costs;
2. starts a daemon thread that every `INTERVAL_S` compares the process's anonymous resident memory
   (``RssAnon``) with what malloc has in use (``mallinfo2``) and calls ``malloc_trim(0)`` when
   the freed-but-resident part has grown by more than ``max(256 MiB, in use / 4)`` since the last
   trim. ``malloc_trim`` releases the whole free pages inside the heap (not only its top). The
   baseline is re-read after each trim, so memory that trimming cannot release (Python's own
   arenas, library buffers) never makes it trim again; a process whose heap keeps less than 256
   MiB free never trims at all. Two trims are at least `MIN_GAP_CPU_S` of the process's CPU time
   apart: a trim also gives back the free pages a computation is about to reuse (one Atlas
   chunk's working set), and each of those is faulted in again.

Effect (docs/benchmarks.md): Atlas fwd+bwd at T = 4,096 grew the process by 1,069 MiB (live
tensors 788 MiB, 1.36x) instead of 3,551 MiB, 47 trims, CPU time 241 s against 231 s in a run
under another load; ``atlas train examples/atlas_lmm_small.toml`` takes the same CPU time with
and without it (and 16x fewer page faults).

Safety: only on glibc with ``mallinfo2`` (glibc >= 2.33) and ``/proc/self/status``; anywhere else
(macOS, Windows, musl) `configure` does nothing and says why in `status`. ``ATLAS_ALLOCATOR=off``
turns it off; so does any of glibc's own ``MALLOC_*_`` variables or ``GLIBC_TUNABLES`` in the
environment (the user's choice wins). Idempotent per process; a forked child starts unconfigured.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import os
import threading
import time
from typing import Any

#: ``mallopt`` parameters (malloc.h)
M_TRIM_THRESHOLD = -1
M_MMAP_THRESHOLD = -3
#: served from the heap up to this size (glibc's own ceiling for its dynamic threshold)
MMAP_THRESHOLD = 32 << 20
#: ``free`` returns the heap's top only beyond this (the trim thread does the rest)
TRIM_THRESHOLD = 1 << 30
#: freed-but-resident memory tolerated above the last trim: max(FLOOR, FRACTION * in use)
FLOOR_BYTES = 256 << 20
FRACTION = 0.25
INTERVAL_S = 0.2
#: process CPU seconds between two trims at least: a trim gives back the free pages of the
#: working set too, which are faulted in again (about 0.2 s of CPU for Atlas' 250 MiB), so this
#: caps the cost at a few percent; the heap can outgrow the budget by what it grows in that time
MIN_GAP_CPU_S = 4.0
#: environment variables by which the user chose glibc's behaviour; any of them set: do nothing
GLIBC_VARIABLES = ("GLIBC_TUNABLES", "MALLOC_MMAP_THRESHOLD_", "MALLOC_TRIM_THRESHOLD_",
                   "MALLOC_TOP_PAD_", "MALLOC_ARENA_MAX")


class _MallInfo2(ctypes.Structure):
    _fields_ = [(name, ctypes.c_size_t) for name in (
        "arena", "ordblks", "smblks", "hblks", "hblkhd", "usmblks", "fsmblks", "uordblks",
        "fordblks", "keepcost")]


_lock = threading.Lock()
_state: dict[str, Any] = {"pid": None}


def glibc() -> ctypes.CDLL | None:
    """The process's C library when it is glibc with ``mallinfo2`` and ``malloc_trim``, else None."""
    try:
        libc = ctypes.CDLL(None)
        version = libc.gnu_get_libc_version
        libc.mallinfo2, libc.malloc_trim, libc.mallopt  # noqa: B018 - AttributeError if absent
    except (OSError, AttributeError, TypeError):  # TypeError: CDLL(None) on Windows
        return None
    version.restype = ctypes.c_char_p
    libc.mallinfo2.restype = _MallInfo2
    libc.malloc_trim.argtypes = [ctypes.c_size_t]
    libc.mallopt.argtypes = [ctypes.c_int, ctypes.c_int]
    return libc


def release_free() -> bool:
    """Give the heap's free pages back to the kernel now (``malloc_trim(0)``), once: after a
    one-off burst of freeing, such as a model's initial weights replaced by a checkpoint's. False
    where the C library is not glibc."""
    libc = glibc()
    if libc is None:
        return False
    libc.malloc_trim(0)
    return True


def rss_anon() -> int | None:
    """The process's anonymous resident bytes (``RssAnon`` of /proc/self/status), None if unknown."""
    try:
        with open("/proc/self/status", "rb") as f:
            for line in f:
                if line.startswith(b"RssAnon:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return None


def in_use(libc: ctypes.CDLL) -> int:
    """Bytes malloc has handed out and not taken back (heap and mmapped chunks)."""
    m = libc.mallinfo2()
    return m.uordblks + m.hblkhd


class Keeper:
    """The trim thread's rule (see module docstring), one `check` per look."""

    def __init__(self, libc: ctypes.CDLL, floor: int = FLOOR_BYTES, fraction: float = FRACTION,
                 min_gap_cpu_s: float = MIN_GAP_CPU_S):
        self.libc, self.floor, self.fraction, self.min_gap = libc, floor, fraction, min_gap_cpu_s
        self.trims = 0
        self.base = self.waste()
        self.last = -float("inf")  # process CPU time of the last trim

    def waste(self) -> int:
        """Anonymous resident bytes that malloc does not count as in use."""
        return (rss_anon() or 0) - in_use(self.libc)

    def check(self) -> bool:
        """Trim when the freed-but-resident memory grew past the budget; True if it trimmed."""
        now = time.process_time()
        if now - self.last < self.min_gap:
            return False
        used = in_use(self.libc)
        grown = (rss_anon() or 0) - used - self.base
        if grown <= max(self.floor, self.fraction * used):
            return False
        self.libc.malloc_trim(0)
        self.trims += 1
        self.base = self.waste()
        self.last = time.process_time()
        return True


def _loop(keeper: Keeper, interval: float) -> None:
    while True:
        time.sleep(interval)
        try:
            keeper.check()
        except Exception:  # noqa: BLE001 - never take the process down; stop looking instead
            return


def configure(floor: int = FLOOR_BYTES, fraction: float = FRACTION,
              interval: float = INTERVAL_S, min_gap_cpu_s: float = MIN_GAP_CPU_S) -> dict[str, Any]:
    """Set glibc's thresholds and start the trim thread (module docstring); once per process.
    Returns `status`."""
    with _lock:
        if _state.get("pid") == os.getpid():
            return status()
        _state.clear()
        _state.update(pid=os.getpid(), applied=False, reason="")
        setting = os.environ.get("ATLAS_ALLOCATOR", "").strip().lower()
        chosen = [v for v in GLIBC_VARIABLES if v in os.environ]
        libc = glibc()
        if setting in ("off", "0", "false", "no"):
            _state["reason"] = f"ATLAS_ALLOCATOR={setting}"
        elif chosen:
            _state["reason"] = f"{chosen[0]} is set: glibc's behaviour is the user's choice"
        elif libc is None:
            _state["reason"] = "not glibc >= 2.33 (no mallinfo2): nothing to do"
        elif rss_anon() is None:
            _state["reason"] = "no RssAnon in /proc/self/status: nothing to do"
        else:
            ok = (libc.mallopt(M_MMAP_THRESHOLD, MMAP_THRESHOLD) == 1,
                  libc.mallopt(M_TRIM_THRESHOLD, TRIM_THRESHOLD) == 1)
            keeper = Keeper(libc, floor, fraction, min_gap_cpu_s)
            thread = threading.Thread(target=_loop, args=(keeper, interval),
                                      name="atlas-malloc-trim", daemon=True)
            thread.start()
            _state.update(applied=True, mallopt=all(ok), keeper=keeper, thread=thread,
                          glibc=libc.gnu_get_libc_version().decode(), floor=floor,
                          fraction=fraction, interval=interval, min_gap_cpu_s=min_gap_cpu_s)
        return status()


def status() -> dict[str, Any]:
    """What `configure` did in this process: ``applied``, ``reason`` (why not), ``trims`` so far,
    the glibc version and the budget."""
    if _state.get("pid") != os.getpid():
        return {"applied": False, "reason": "not configured in this process"}
    out = {k: v for k, v in _state.items() if k not in ("keeper", "thread", "pid")}
    keeper, thread = _state.get("keeper"), _state.get("thread")
    if keeper is not None:
        out["trims"] = keeper.trims
        out["running"] = bool(thread and thread.is_alive())
    return out
