"""The benchmark's float64 equivalence gate: correct strategies pass (exact or anchored), a
deliberately broken one is marked FAILED and gets no speedup."""

import pytest
import torch

from atlas_core.bench import BenchConfig, StrategySubject, get_case, run_bench
from atlas_core.bench.subjects import default_baselines_dir, load_baselines
from atlas_core.strategies.chunkwise import Chunkwise, ChunkwiseParams


class BrokenChunkwise(Chunkwise):
    """Chunkwise whose outputs are off by a little: the gate must notice."""

    name = "test:broken"

    def run(self, rule, inputs):
        y, state = super().run(rule, inputs)
        return y * (1 + 1e-5), state


def test_gate_marks_exact_and_anchored_strategies():
    case = get_case("delta")
    exact = StrategySubject("core:exact_chunk", {"chunk_size": 8}).check(case)
    anchored = StrategySubject("core:chunkwise", {"chunk_size": 8}).check(case)
    assert exact.status == "passed" and exact.detail.startswith("exact")
    assert anchored.status == "passed" and anchored.detail.startswith("anchored")
    assert "chunk size 1 equals core:sequential" in anchored.detail


def test_gate_fails_a_broken_strategy_and_no_speedup_is_reported():
    broken = StrategySubject(BrokenChunkwise(ChunkwiseParams(chunk_size=8)), label="broken(C=8)")
    check = broken.check(get_case("delta"))
    assert check.status == "FAILED"
    assert "differs from core:sequential" in check.detail
    cfg = BenchConfig(rules=["delta"], lengths=[24], batch=1, heads=1, dim=4, chunk=8, repeats=1,
                      memory=False, threads=1, strategies=["core:sequential", "core:chunkwise"])
    res = run_bench(cfg, subjects=[broken])
    rows = {r.subject: r for r in res.rows}
    assert rows["core:chunkwise(C=8)"].speedup is not None  # passed: speedup reported
    assert rows["broken(C=8)"].check == "FAILED"
    assert rows["broken(C=8)"].speedup is None
    assert "no speedup reported" in rows["broken(C=8)"].note


def test_seed000_baseline_is_the_loop_anchored_once_per_call():
    subjects, problems = load_baselines(default_baselines_dir())
    seed = [s for s in subjects if s.name.startswith("seed000")]
    assert seed, problems
    for name in ("titans", "omega16", "delta"):
        check = seed[0].check(get_case(name))
        assert check.status == "passed", (name, check.detail)
        assert "anchored every 37 tokens" in check.detail


def test_seed000_scan_equals_a_loop():
    import importlib.util

    path = default_baselines_dir() / "seed000.py"
    spec = importlib.util.spec_from_file_location("seed000_for_test", path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    g = torch.Generator().manual_seed(0)
    for T in (1, 2, 7, 16):
        a = torch.rand(2, 3, T, generator=g, dtype=torch.float64)
        x = torch.randn(2, 3, T, 4, 5, generator=g, dtype=torch.float64)
        h0 = torch.randn(2, 3, 4, 5, generator=g, dtype=torch.float64)
        h, want = h0, []
        for t in range(T):
            h = a[:, :, t, None, None] * h + x[:, :, t]
            want.append(h)
        torch.testing.assert_close(mod.scalar_scan(a, x, h0), torch.stack(want, 2), atol=1e-12, rtol=0)


def test_a_baseline_that_cannot_load_is_reported(tmp_path):
    (tmp_path / "good.py").write_text("def subjects(config):\n    return []\n")
    (tmp_path / "bad.py").write_text("import not_a_module_anywhere\n")
    subjects, problems = load_baselines(tmp_path)
    assert subjects == []
    assert len(problems) == 1 and problems[0].startswith("bad.py: ModuleNotFoundError")


def test_unknown_rule_is_a_clear_error():
    with pytest.raises(ValueError, match="unknown benchmark rule 'titan'.*titans"):
        BenchConfig(rules=["titan"]).validate()


def test_titans_pytorch_adapter_runs_when_installed():
    pytest.importorskip("titans_pytorch")
    from atlas_core.bench.cases import make_inputs

    subjects, _ = load_baselines(default_baselines_dir())
    tp = [s for s in subjects if s.name.startswith("titans-pytorch")]
    assert len(tp) == 1
    case = get_case("titans_deep_layer")
    assert tp[0].supports(case)[0] and not tp[0].supports(get_case("titans"))[0]
    sizes = dict(B=1, H=2, Dk=8, Dv=8)
    mem = tp[0].setup(case, sizes, torch.float32)
    inp = make_inputs(case, (), T=20, **sizes)
    y = tp[0].forward(mem, inp)
    assert y.shape == (1, 20, 16) and torch.isfinite(y).all()
    assert tp[0].check(case).status == "external"
