"""How many intra-op threads `atlas train` gives torch, and why (the start line says both).

torch's default is one thread per core whatever else the machine runs; on a busy machine its
threads then wait on each other and a run can be many times slower than with one thread (measured
on a loaded 2-core machine: 254 tokens/s at 2 threads, 6,492 at 1). So the trainer chooses, in
this order:

1. ``train.threads`` (or ``--threads N``) when it is a number;
2. ``OMP_NUM_THREADS`` when it is set (the usual way to pin threads; torchrun sets it to 1);
3. under ``torchrun``: 1 per process (torchrun starts one process per core or GPU);
4. otherwise (``threads = "auto"``, the default): the physical cores this process may use (its
   CPU affinity and cgroup quota), times the share of the machine that is idle right now
   (sampled from ``/proc/stat`` for 0.1 s), divided among the ``--nproc`` processes; at least 1.

A thread count changes the order of floating-point sums, so runs at different counts agree to
rounding, not bit for bit: set ``train.threads`` for bitwise-repeatable runs.
"""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Any

AUTO = "auto"
SAMPLE_S = 0.1


def available_cpus() -> set[int]:
    """The logical CPUs this process may run on."""
    try:
        return set(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return set(range(os.cpu_count() or 1))


def _quota_cores() -> float | None:
    """The cgroup v2 CPU quota in cores (``cpu.max``), or None when unlimited or unknown."""
    try:
        quota, period = Path("/sys/fs/cgroup/cpu.max").read_text().split()[:2]
        return None if quota == "max" else int(quota) / int(period)
    except (OSError, ValueError):
        return None


def physical_cores(cpus: set[int] | None = None) -> int:
    """Physical cores among ``cpus`` (hyper-threads of one core count once), capped by the
    cgroup quota; at least 1."""
    cpus = available_cpus() if cpus is None else cpus
    cores = set()
    for cpu in cpus:
        topo = Path(f"/sys/devices/system/cpu/cpu{cpu}/topology")
        try:
            cores.add((topo / "physical_package_id").read_text().strip()
                      + ":" + (topo / "core_id").read_text().strip())
        except OSError:
            cores.add(f"cpu{cpu}")  # no topology: every logical CPU counts
    n = len(cores)
    quota = _quota_cores()
    if quota is not None:
        n = min(n, max(1, int(quota)))
    return max(1, n)


def _cpu_times() -> tuple[int, int] | None:
    """(busy, total) jiffies of the whole machine, from ``/proc/stat``; None off Linux."""
    try:
        with open("/proc/stat") as fh:
            fields = [int(x) for x in fh.readline().split()[1:]]
    except (OSError, ValueError):
        return None
    idle = fields[3] + (fields[4] if len(fields) > 4 else 0)  # idle + iowait
    return sum(fields) - idle, sum(fields)


def busy_fraction(sample_s: float = SAMPLE_S) -> float:
    """The share of the machine's CPU time that other work used over ``sample_s`` seconds (this
    process sleeps meanwhile); 0.0 where it cannot be measured."""
    first = _cpu_times()
    if first is None:
        return 0.0
    time.sleep(sample_s)
    second = _cpu_times()
    if second is None or second[1] <= first[1]:
        return 0.0
    return min(1.0, max(0.0, (second[0] - first[0]) / (second[1] - first[1])))


def plan_threads(setting: Any, *, processes: int = 1, torchrun: bool = False,
                 env: dict[str, str] | None = None, physical: int | None = None,
                 busy: float | None = None) -> tuple[int, str]:
    """The thread count per process and the reason, following the module docstring.
    ``physical`` and ``busy`` (the measurements) are taken here when not given."""
    env = os.environ if env is None else env
    if setting != AUTO and setting is not None:
        return int(setting), "train.threads"
    omp = env.get("OMP_NUM_THREADS", "").strip()
    if omp.isdigit() and int(omp) >= 1:
        return int(omp), "OMP_NUM_THREADS"
    if torchrun:
        return 1, "1 per process under torchrun"
    physical = physical_cores() if physical is None else physical
    busy = busy_fraction() if busy is None else busy
    idle = max(1, round(physical * (1.0 - busy)))
    count = max(1, idle // max(1, processes))
    why = f"{physical} physical core{'s' if physical != 1 else ''}, {busy:.0%} busy"
    if processes > 1:
        why += f", shared by {processes} processes"
    return count, why


def describe(count: int, why: str, processes: int = 1) -> str:
    """``2 threads (2 physical cores, 0% busy)``: the start line's words."""
    each = " each" if processes > 1 else ""
    return f"{count} thread{'s' if count != 1 else ''}{each} ({why})"
