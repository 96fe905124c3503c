"""The benchmark's float64 equivalence gate: every subject is compared with core:sequential on the
rule it runs (an anchored subject: on the rule with anchor = C), as one call and as two calls; a
deliberately broken one is marked FAILED and gets no speedup. Also: which subjects a case gets, and
the targets read from given rows."""

import pytest
import torch

from atlas_core.bench import BenchConfig, StrategySubject, get_case, run_bench
from atlas_core.bench.report import targets
from atlas_core.bench.runner import BenchResult, Row, default_subjects
from atlas_core.bench.subjects import default_baselines_dir, load_baselines
from atlas_core.strategies.chunkwise import Chunkwise, ChunkwiseParams


class BrokenChunkwise(Chunkwise):
    """Chunkwise whose outputs are off by a little: the gate must notice."""

    name = "test:broken"

    def run(self, rule, inputs):
        y, state = super().run(rule, inputs)
        return y * (1 + 1e-5), state


class UnalignedChunkwise(Chunkwise):
    """Chunkwise that starts a chunk at every call: right for one call, wrong for a call cut
    inside a chunk (it ignores where in its anchor block the carried state says it starts)."""

    name = "test:unaligned"

    def run(self, rule, inputs):
        return self.run_torch(rule, inputs)


def test_every_subject_is_gated_against_sequential_on_the_rule_it_runs():
    case = get_case("delta")  # a per-token rule (anchor = 1)
    exact = StrategySubject("core:exact_chunk", {"chunk_size": 8}).check(case)
    assert exact.status == "passed"
    assert exact.detail.startswith("equals core:sequential (T=37; also as two calls cut at token 13")
    # core:chunkwise refuses the per-token rule at C = 8 ...
    ok, why = StrategySubject("core:chunkwise", {"chunk_size": 8}).supports(case)
    assert not ok and "anchor" in why
    # ... and runs, as an anchored subject, the rule with anchor = 8, equal to sequential on it
    anchored = StrategySubject("core:chunkwise", {"chunk_size": 8}, anchor=8)
    assert anchored.name == "core:chunkwise(C=8) on anchor=8" and anchored.supports(case)[0]
    check = anchored.check(case)
    assert check.status == "passed", check.detail
    assert check.detail.startswith("equals core:sequential on the rule with anchor = 8 (T=37")


def test_gate_fails_a_broken_strategy_and_no_speedup_is_reported():
    broken = StrategySubject(BrokenChunkwise(ChunkwiseParams(chunk_size=8)), label="broken(C=8)", anchor=8)
    check = broken.check(get_case("delta"))
    assert check.status == "FAILED"
    assert "differs from core:sequential on the rule with anchor = 8" in check.detail
    cfg = BenchConfig(rules=["delta"], lengths=[24], batch=1, heads=1, dim=4, chunk=8, repeats=1,
                      memory=False, threads=1, strategies=["core:sequential", "core:chunkwise"])
    res = run_bench(cfg, subjects=[broken])
    rows = {r.subject: r for r in res.rows}
    assert rows["core:chunkwise(C=8) on anchor=8"].speedup is not None  # passed: speedup reported
    assert rows["broken(C=8)"].check == "FAILED"
    assert rows["broken(C=8)"].speedup is None
    assert "no speedup reported" in rows["broken(C=8)"].note


def test_gate_splits_the_call_inside_a_chunk():
    sub = StrategySubject(UnalignedChunkwise(ChunkwiseParams(chunk_size=8)), label="unaligned(C=8)", anchor=16)
    check = sub.check(get_case("delta"))
    assert check.status == "FAILED", check.detail
    assert check.detail.startswith("one call equals core:sequential on the rule with anchor = 16, but two "
                                   "calls cut at token 13 differ from it")


def test_default_subjects_anchor_the_rule_a_chunked_strategy_refuses():
    cfg = BenchConfig(chunk=64, exact_chunks=[16, 32])
    names = [s.name for s in default_subjects(cfg, get_case("titans"))]
    assert names[0] == "core:sequential"
    assert {"core:exact_chunk(C=16)", "core:exact_chunk(C=32)", "core:exact_chunk(C=64)",
            "core:chunkwise(C=64) on anchor=64"} <= set(names)
    assert "core:chunkwise(C=64)" not in names
    # titans:titans_deep has anchor = 16: C = 8 divides it (the rule as given), C = 64 does not
    deep8 = [s.name for s in default_subjects(BenchConfig(chunk=8), get_case("titans_deep"))]
    assert "core:chunkwise(C=8)" in deep8
    deep64 = [s.name for s in default_subjects(cfg, get_case("titans_deep"))]
    assert "core:chunkwise(C=64) on anchor=64" in deep64 and "core:exact_chunk(C=64)" not in deep64
    layer = default_subjects(cfg, get_case("titans_deep_layer"))
    assert [s.name for s in layer] == ["atlas MemoryLayer, core:chunkwise(C=64) on anchor=64"]
    decode = [s.name for s in default_subjects(cfg, get_case("decode"))]
    assert decode == ["model.step, core:chunkwise(C=16)", "model.step, core:chunkwise(C=1024)"]


def test_layer_gate_compares_the_layer_with_its_sequential_twin():
    from atlas_core.bench import LayerSubject

    sub = LayerSubject("core:chunkwise", {"chunk_size": 8})  # 8 divides titans_deep's anchor 16
    check = sub.check(get_case("titans_deep_layer"))
    assert check.status == "passed", check.detail
    assert check.detail.startswith("equals core:sequential (T=37; also as two calls cut at token 13")


def test_seed000_baseline_is_the_rule_with_one_anchor_block_per_call():
    from atlas_core.errors import StrategyError
    from atlas_core.rule import MAX_ANCHOR

    subjects, problems = load_baselines(default_baselines_dir())
    seed = [s for s in subjects if s.name.startswith("seed000")]
    assert seed, problems
    seed = seed[0]
    assert seed.anchor == MAX_ANCHOR
    for name in ("titans", "omega16", "delta"):
        check = seed.check(get_case(name))
        assert check.status == "passed", (name, check.detail)
        assert check.detail == f"equals core:sequential on the rule with anchor = {MAX_ANCHOR} (T=37)"
    # it is not the per-token rule, and it cannot continue a block from a carried state
    case = get_case("titans")
    ok, why = seed.strategy.supports(case.rule(2, 8, 8))
    assert not ok and "anchor = 1" in why
    rule = case.rule(2, 8, 8, torch.float64, anchor=16)
    from atlas_core.bench.cases import make_inputs

    inp = make_inputs(case, rule.gate_names, B=1, T=20, H=2, Dk=8, Dv=8, dtype=torch.float64)
    with pytest.raises(StrategyError, match="at most 16 tokens"):
        rule(inp.q, inp.k, inp.v, gates=inp.gates, strategy=seed._strategy())
    _, state = rule(inp.q[:, :5], inp.k[:, :5], inp.v[:, :5], gates={k: g[:, :5] for k, g in inp.gates.items()},
                    strategy=seed._strategy())
    with pytest.raises(StrategyError, match="starts 5 tokens into a block"):
        rule(inp.q[:, 5:9], inp.k[:, 5:9], inp.v[:, 5:9], gates={k: g[:, 5:9] for k, g in inp.gates.items()},
             state=state, strategy=seed._strategy())


def _result(rows, checks=(), problems=(), chunk=64):
    return BenchResult({"chunk": chunk}, {}, list(checks), rows, list(problems))


def test_targets_exact_rule_against_the_anchored_rule():
    anc = "core:chunkwise(C=64) on anchor=64"
    rows = [Row("titans", anc, "strategy", 4096, train_ms=100.0, check="passed"),
            Row("titans", anc, "strategy", 16384, train_ms=400.0, check="passed"),
            Row("titans", "core:exact_chunk(C=32)", "strategy", 4096, train_ms=115.0, check="passed"),
            Row("titans", "core:exact_chunk(C=64)", "strategy", 4096, train_ms=130.0, check="passed"),
            Row("titans", "core:exact_chunk(C=32)", "strategy", 16384, train_ms=470.0, check="passed")]
    t = targets(_result(rows))[0]
    assert t["target"].startswith("titans, fwd+bwd at T=4096 and 16384: core:exact_chunk")
    assert t["ok"] is True  # best 115 / 100 and 470 / 400, both <= 1.2
    assert "T=4096: core:exact_chunk(C=32) 115.0 ms / 100.0 ms = 1.15x" in t["measured"]
    rows[-1].train_ms = 500.0  # 1.25x at T=16384
    assert targets(_result(rows))[0]["ok"] is False
    assert targets(_result(rows[:4]))[0]["ok"] is None  # T=16384 not measured for exact_chunk
    assert targets(_result([]))[0]["ok"] is None


def test_targets_fla_and_decode():
    fla = "fla naive_chunk_gated_delta_rule(C=64)"
    rows = [Row("delta", "core:exact_chunk(C=64)", "strategy", 4096, fwd_ms=10.0, train_ms=30.0, check="passed"),
            Row("delta", fla, "baseline", 4096, fwd_ms=20.0, train_ms=90.0, check="external")]
    small, large = "model.step, core:chunkwise(C=16)", "model.step, core:chunkwise(C=1024)"
    rows += [Row("decode", small, "decode", 512, fwd_ms=2.0), Row("decode", large, "decode", 512, fwd_ms=2.4)]
    checks = [{"case": "decode", "subject": s, "status": "passed"} for s in (small, large)]
    tg = targets(_result(rows, checks))
    assert tg[1]["ok"] is True and "fwd+bwd 90.0 / 30.0 ms = 3.00x" in tg[1]["measured"]
    assert tg[2]["ok"] is True and "T=512: 2.40 / 2.00 ms = 1.20x" in tg[2]["measured"]
    rows[3].fwd_ms = 3.2  # 1.6x slower at chunk 1024
    assert targets(_result(rows, checks))[2]["ok"] is False
    none = targets(_result([], problems=["fla_naive.py: ImportError: fla-core is not installed (pip ...)"]))
    assert none[1]["ok"] is None and "fla-core is not installed" in none[1]["measured"]


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
