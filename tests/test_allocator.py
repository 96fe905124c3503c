"""`atlas_core.allocator`: glibc's thresholds and the trim thread, applied where a process starts.

The mechanism is checked in fresh processes (glibc's dynamic thresholds depend on what the process
freed before): after `configure`, a 4 MiB malloc comes from the heap instead of ``mmap``, and
freed-but-resident heap memory beyond the budget is handed back by the trim thread while, without
it, it stays resident. Where the C library is not glibc, `configure` does nothing and says why."""

import subprocess
import sys
import textwrap

import pytest

from atlas_core import allocator

GLIBC = allocator.glibc() is not None and allocator.rss_anon() is not None
needs_glibc = pytest.mark.skipif(not GLIBC, reason="the allocator settings apply to glibc on Linux only")


def _run(code: str, **env) -> str:
    import os

    environ = {k: v for k, v in os.environ.items()
               if k != "ATLAS_ALLOCATOR" and k not in allocator.GLIBC_VARIABLES}
    environ.update(env)
    done = subprocess.run([sys.executable, "-c", textwrap.dedent(code)], capture_output=True,
                          text=True, env=environ, timeout=120)
    assert done.returncode == 0, done.stderr
    return done.stdout.strip().splitlines()[-1]


MMAP_PROBE = """
    import ctypes
    from atlas_core import allocator
    {configure}
    libc = allocator.glibc()
    libc.malloc.restype = ctypes.c_void_p
    before = libc.mallinfo2().hblks
    p = libc.malloc(4 << 20)
    print(libc.mallinfo2().hblks - before)
"""


@needs_glibc
def test_configure_serves_4_mib_from_the_heap():
    assert _run(MMAP_PROBE.format(configure="")) == "1"  # glibc's default: mmap above 128 KiB
    assert _run(MMAP_PROBE.format(configure="print(allocator.configure())")) == "0"


FRAGMENTED = """
    import ctypes, time
    from atlas_core import allocator
    st = allocator.configure(floor=32 << 20, fraction=0.0, interval=0.02, min_gap_cpu_s=0.0)
    libc = allocator.glibc()
    libc.malloc.restype = ctypes.c_void_p
    libc.free.argtypes = [ctypes.c_void_p]
    libc.mallopt(allocator.M_TRIM_THRESHOLD, allocator.TRIM_THRESHOLD)  # also without configure
    libc.mallopt(allocator.M_MMAP_THRESHOLD, allocator.MMAP_THRESHOLD)
    big, pins = [], []
    for _ in range(96):  # 1 MiB blocks, each followed by a small block that outlives it
        b = libc.malloc(1 << 20)
        ctypes.memset(b, 1, 1 << 20)
        big.append(b)
        pins.append(libc.malloc(64))
    full = allocator.rss_anon()
    for b in big:
        libc.free(b)
    time.sleep(1.0)
    released = (full - allocator.rss_anon()) >> 20
    print(released, allocator.status().get("trims", 0), st["applied"])
"""


@needs_glibc
def test_trim_thread_hands_back_fragmented_free_memory():
    released, trims, applied = _run(FRAGMENTED).split()
    assert applied == "True" and int(trims) >= 1
    assert int(released) >= 64, f"only {released} MiB of 96 MiB freed was handed back"
    # the same without the thread: the freed memory stays resident (what the test guards against)
    released, trims, applied = _run(FRAGMENTED, ATLAS_ALLOCATOR="off").split()
    assert applied == "False" and int(trims) == 0 and int(released) < 16


@pytest.fixture
def fresh_state(monkeypatch):
    monkeypatch.setattr(allocator, "_state", {"pid": None})
    for name in ("ATLAS_ALLOCATOR", *allocator.GLIBC_VARIABLES):
        monkeypatch.delenv(name, raising=False)
    return monkeypatch


def test_no_glibc_does_nothing(fresh_state):
    fresh_state.setattr(allocator, "glibc", lambda: None)
    st = allocator.configure()
    assert st["applied"] is False and "glibc" in st["reason"]
    assert allocator.configure() == st  # once per process


@pytest.mark.parametrize("env", [("ATLAS_ALLOCATOR", "off"), ("MALLOC_ARENA_MAX", "2"),
                                 ("GLIBC_TUNABLES", "glibc.malloc.trim_threshold=1")])
def test_the_users_choice_wins(fresh_state, env):
    fresh_state.setenv(*env)
    st = allocator.configure()
    assert st["applied"] is False and env[0] in st["reason"]


def test_the_atlas_cli_and_train_configure_it(monkeypatch):
    calls = []
    monkeypatch.setattr(allocator, "configure", lambda *a, **k: calls.append("cli"))
    from atlas_cli import main

    with pytest.raises(SystemExit):
        main.run(["--version"])
    assert calls == ["cli"]

    from atlas_core.train import launch

    monkeypatch.setattr(launch, "configure_allocator", lambda: calls.append("train"))
    monkeypatch.setattr(launch, "_train", lambda *a: {"ok": True})
    assert launch.train(object()) == {"ok": True}
    assert calls == ["cli", "train"]


def test_trims_only_past_the_budget_and_not_more_often_than_the_cpu_gap(monkeypatch):
    """`Keeper.check` with a stand-in C library: 100 MiB in use, resident memory growing."""

    class FakeLibc:
        trims = 0

        def mallinfo2(self):
            return allocator._MallInfo2(uordblks=100 << 20)

        def malloc_trim(self, pad):
            FakeLibc.trims += 1

    rss = {"now": 100 << 20}
    monkeypatch.setattr(allocator, "rss_anon", lambda: rss["now"])
    clock = {"now": 0.0}
    monkeypatch.setattr(allocator.time, "process_time", lambda: clock["now"])
    keeper = allocator.Keeper(FakeLibc(), floor=64 << 20, fraction=0.25, min_gap_cpu_s=4.0)
    rss["now"] += 60 << 20  # 60 MiB freed but resident: under max(64 MiB, 25 MiB)
    assert not keeper.check() and FakeLibc.trims == 0
    rss["now"] += 10 << 20  # 70 MiB: over
    assert keeper.check() and FakeLibc.trims == 1  # the base is re-read after the trim: 70 MiB
    rss["now"] += 80 << 20  # over again, but only 1 CPU second later
    clock["now"] += 1.0
    assert not keeper.check()
    clock["now"] += 3.0
    assert keeper.check() and FakeLibc.trims == 2
