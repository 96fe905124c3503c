"""``atlas bench --device``: the CPU run is today's, CUDA without CUDA is one usage error, ``auto``
resolves to what is there, every timed region is synchronised on a CUDA device (the synchronise
call is mocked, so this runs on a CPU machine), CUDA's peak-memory counter is read relative to
what was allocated before, and the figures name the device they came from."""

from __future__ import annotations

import json

import pytest
import torch
from typer.testing import CliRunner

from atlas_cli.main import make_app
from atlas_core.bench import BenchConfig, StrategySubject, get_case, run_bench
from atlas_core.bench import device as bench_device
from atlas_core.bench import memory, runner, subjects
from atlas_core.bench.subjects import Check, Subject

TINY = ["--rules", "delta", "--lengths", "8,16", "--batch", "1", "--heads", "1", "--dim", "4",
        "--chunk", "4", "--exact-chunks", "4", "--repeats", "1", "--threads", "1"]
no_cuda = pytest.mark.skipif(torch.cuda.is_available(), reason="checks the machine without CUDA")


def _bench_json(*extra: str) -> dict:
    res = CliRunner().invoke(make_app(), ["--format", "json", "bench", *TINY, *extra])
    assert res.exit_code == 0, res.output
    return json.loads(res.stdout)


def test_device_cpu_gives_todays_rows():
    plain, cpu = _bench_json(), _bench_json("--device", "cpu")
    assert [list(r) for r in cpu["rows"]] == [list(r) for r in plain["rows"]]  # same keys, same order
    what = lambda d: [(r["case"], r["subject"], r["T"], r["status"], r["check"]) for r in d["rows"]]  # noqa: E731
    assert what(cpu) == what(plain) and len(what(cpu)) >= 4
    assert all(r["status"] == "ok" and r["fwd_ms"] > 0 and r["peak_train_mib"] > 0 for r in cpu["rows"])
    assert [(c["subject"], c["status"], c["detail"]) for c in cpu["checks"]] == \
        [(c["subject"], c["status"], c["detail"]) for c in plain["checks"]]
    # the CPU check is float64 only
    assert not any("float32 too" in c["detail"] for c in cpu["checks"] if c["status"] == "passed")


def test_json_names_the_device():
    data = _bench_json("--device", "cpu", "--no-baselines", "--no-memory")
    assert data["config"]["device"] == "cpu"
    m = data["machine"]
    assert m["device"] == "cpu" and m["device_name"] == m["cpu"] and m["device_name"]
    assert data["config"]["seq_max"] == 4096  # the CPU's default, as before


def test_gpu_defaults_cap_the_per_token_loop():
    assert runner.device_defaults("cpu") == {"seq_max": 4096, "repeats": 3}
    assert runner.device_defaults(torch.device("cuda")) == {"seq_max": 512, "repeats": 1}
    cfg = BenchConfig()
    assert (cfg.seq_max, cfg.repeats) == (4096, 3)  # the library's defaults are the CPU's


@no_cuda
def test_device_cuda_without_cuda_is_one_usage_error():
    res = CliRunner().invoke(make_app(), ["bench", *TINY, "--device", "cuda"])
    assert res.exit_code == 2
    assert res.exception is None or isinstance(res.exception, SystemExit)  # no traceback
    text = " ".join(res.output.split())
    assert "--device" in text and "'cuda'" in text and "CUDA is not available" in text
    assert "use --device cpu, or --device auto" in text
    assert "Traceback" not in res.output


def test_unknown_device_is_refused():
    res = CliRunner().invoke(make_app(), ["bench", *TINY, "--device", "tpu"])
    assert res.exit_code == 2
    assert "'tpu': not a benchmark device" in " ".join(res.output.split())
    with pytest.raises(ValueError, match="device='tpu'"):
        bench_device.resolve_device("tpu")


@no_cuda
def test_auto_resolves_to_cpu_here():
    assert bench_device.resolve_device("auto") == torch.device("cpu")
    data = _bench_json("--device", "auto", "--no-baselines", "--no-memory")
    assert data["config"]["device"] == "cpu" and data["machine"]["device"] == "cpu"
    with pytest.raises(ValueError, match="CUDA is not available"):
        run_bench(BenchConfig(rules=["delta"], lengths=[8], batch=1, heads=1, dim=4, device="cuda"))


@pytest.fixture
def events(monkeypatch):
    """Record the order of synchronise calls, clock readings and runs."""
    log: list = []
    monkeypatch.setattr(torch.cuda, "synchronize", lambda device=None: log.append(("sync", str(device))))
    now = iter(range(1000))
    monkeypatch.setattr(runner.time, "perf_counter", lambda: (log.append("clock"), float(next(now)))[1])
    return log


def test_timer_synchronises_before_every_clock_reading_on_cuda(events):
    cuda = torch.device("cuda")
    t, runs = runner._timed(lambda: events.append("run"), repeats=1, slow_s=5.0, device=cuda)
    one = [("sync", "cuda"), "clock", "run", ("sync", "cuda"), "clock"]
    assert events == one + one and runs == 2 and t == 1.0


def test_timer_does_not_synchronise_on_the_cpu(events):
    runner._timed(lambda: events.append("run"), repeats=1, slow_s=5.0, device=torch.device("cpu"))
    runner._timed(lambda: events.append("run"), repeats=1, slow_s=5.0)
    assert events == ["clock", "run", "clock"] * 4


def test_cuda_peak_is_the_allocator_peak_minus_what_was_there(monkeypatch):
    calls = []
    stats = {"now": 1000, "peak": 1000}
    monkeypatch.setattr(torch.cuda, "synchronize", lambda device=None: calls.append("sync"))
    monkeypatch.setattr(torch.cuda, "reset_peak_memory_stats",
                        lambda device=None: (calls.append("reset"), stats.update(peak=stats["now"])))
    monkeypatch.setattr(torch.cuda, "memory_allocated", lambda device=None: stats["now"])
    monkeypatch.setattr(torch.cuda, "max_memory_allocated", lambda device=None: stats["peak"])

    def work():  # allocates 700 bytes at its peak, keeps 200
        calls.append("work")
        stats.update(peak=stats["now"] + 700, now=stats["now"] + 200)

    assert memory.peak_bytes(work, torch.device("cuda")) == 700
    assert calls == ["sync", "reset", "work", "sync"]
    calls.clear()
    assert memory.peak_bytes(lambda: torch.ones(1000), "cpu") == 4000  # the CPU: live tensor bytes
    assert calls == []


def test_check_on_a_gpu_also_runs_in_float32(monkeypatch):
    """What a GPU check adds, run on the CPU: the subject in float32 against the float64
    reference, within the float32 tolerance (a 1e-3 error passes float64's 1e-8 nowhere, and
    float32's 1e-4 neither)."""
    from atlas_core.strategies.chunkwise import Chunkwise, ChunkwiseParams

    assert subjects.check_dtypes(torch.device("cuda")) == (torch.float64, torch.float32)
    assert subjects.check_dtypes(torch.device("cpu")) == (torch.float64,)
    monkeypatch.setattr(subjects, "check_dtypes", lambda device=None: (torch.float64, torch.float32))
    case = get_case("delta")
    good = StrategySubject("core:exact_chunk", {"chunk_size": 8}).check(case)
    assert good.status == "passed" and "float32" in good.detail and good.max_err < 1e-12

    class Float32Off(Chunkwise):  # right in float64, off by 1e-3 in float32
        name = "test:float32_off"

        def run(self, rule, inputs):
            y, state = super().run(rule, inputs)
            return (y * (1 + 1e-3) if y.dtype == torch.float32 else y), state

    bad = StrategySubject(Float32Off(ChunkwiseParams(chunk_size=8)), label="off", anchor=8).check(case)
    assert bad.status == "FAILED" and "in float32" in bad.detail


class _DeviceBound(Subject):
    """A subject whose check raises on CUDA (or everywhere)."""

    name = "device-bound"

    def __init__(self, everywhere: bool = False) -> None:
        self.everywhere = everywhere

    def check(self, case):
        if self.everywhere or bench_device.current_device().type == "cuda":
            return Check("error", "RuntimeError: Expected all tensors to be on the same device")
        return Check("passed", "equals core:sequential")


def test_a_subject_that_cannot_run_on_cuda_is_skipped_with_the_reason():
    case, cuda = get_case("delta"), torch.device("cuda")
    with bench_device.use_device(cuda):
        sub = _DeviceBound()
        why = runner._not_on_device(case, sub, sub.check(case), cuda)
        assert why.startswith("not run on cuda: its check raised there") and "on the CPU it passed" in why
        broken = _DeviceBound(everywhere=True)  # raises on the CPU too: stays a failure
        assert runner._not_on_device(case, broken, broken.check(case), cuda) == ""
    assert runner._not_on_device(case, sub, Check("error", "x"), torch.device("cpu")) == ""


class _SetupFails(Subject):
    """A baseline whose module cannot be built on the device."""

    name = "setup-fails"
    group = "baseline"

    def check(self, case):
        return Check("external", "not compared")

    def setup(self, case, sizes, dtype):
        raise RuntimeError("no kernel for this device")


@no_cuda
def test_subjects_that_cannot_run_on_the_device_are_skipped_not_failed(monkeypatch):
    """The whole run with the device said to be CUDA on a machine without it: a strategy's check
    raises there and passes on the CPU (skipped, with the reason); a baseline whose setup fails
    there is skipped too; nothing is timed and nothing counts as a failed check."""
    monkeypatch.setattr(runner, "resolve_device", lambda name, option="device": torch.device("cuda"))
    monkeypatch.setattr(runner, "machine_info", lambda device: {"device": str(device)})
    monkeypatch.setattr(runner, "_measure", lambda *a, **k: pytest.fail("nothing may be timed"))
    said = []
    cfg = BenchConfig(rules=["delta"], lengths=[8, 16], batch=1, heads=1, dim=4, chunk=4,
                      exact_chunks=[4], repeats=1, memory=False, strategies=["core:exact_chunk"])
    res = run_bench(cfg, subjects=[_SetupFails()], progress=said.append)
    assert res.config["device"] == "cuda"
    checks = {c["subject"]: c for c in res.checks}
    exact = checks["core:exact_chunk(C=4)"]
    assert exact["status"] == "skipped" and exact["detail"].startswith("not run on cuda: its check raised there")
    assert exact["detail"].endswith("on the CPU it passed")
    assert checks["setup-fails"]["status"] == "external"
    assert [(r.subject, r.T, r.status) for r in res.rows] == [
        ("core:exact_chunk(C=4)", 8, "skipped"), ("core:exact_chunk(C=4)", 16, "skipped"),
        ("setup-fails", 8, "skipped"), ("setup-fails", 16, "skipped")]
    assert all(r.note.startswith("not run on cuda: ") for r in res.rows)
    assert "[delta] setup-fails: not run on cuda: setup failed: RuntimeError: no kernel for this device" in said
    assert not [c for c in res.checks if c["status"] in ("FAILED", "error")]


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_tiny_bench_on_cuda():
    data = _bench_json("--device", "cuda", "--no-baselines")
    assert data["config"]["device"].startswith("cuda") and data["machine"]["device"].startswith("cuda")
    assert data["machine"]["device_name"] == torch.cuda.get_device_name()
    assert all(r["status"] == "ok" and r["fwd_ms"] > 0 and r["peak_train_mib"] > 0 for r in data["rows"])
    passed = [c for c in data["checks"] if c["status"] == "passed"]
    assert passed and all("float32" in c["detail"] for c in passed)
