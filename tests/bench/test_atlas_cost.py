"""Atlas against its FLOP count (`atlas_core.bench.atlas_cost`): the Newton-Schulz term counts the
multiply-adds torch's FLOP counter sees in `newton_schulz`; the bound and the ratio follow from a
row's time; the CLI's --atlas-long is validated."""

from __future__ import annotations

import pytest
import torch
from torch.utils.flop_counter import FlopCounterMode

from atlas_core.bench.atlas_cost import TRAIN_FACTOR, cost_rows, macs_per_token, matmul_rate
from atlas_core.bench.cases import get_case
from atlas_core.bench.runner import BenchConfig, Row
from atlas_plugins.atlas_muon.newton_schulz import newton_schulz


def test_newton_schulz_count_matches_the_flop_counter():
    rule = get_case("atlas").rule(2, 8, 8)
    parts = macs_per_token(rule, 4)
    counted = 0
    for r, c in rule.structure.weight_shapes().values():
        with FlopCounterMode(display=False) as fc:
            newton_schulz(torch.randn(1, r, c), rule.algorithm.ns_steps)
        counted += fc.get_total_flops() // 2 + r * c  # + the normalisation, not a matmul
    assert parts["Newton-Schulz"] == counted
    assert parts["Newton-Schulz"] > sum(v for k, v in parts.items() if k != "Newton-Schulz")


def test_rows_get_tokens_per_second_bound_and_ratio():
    rule = get_case("atlas").rule(2, 8, 8)
    sizes = {"B": 2, "H": 2, "Dk": 8, "Dv": 8}
    rows = [Row("atlas", "s(C=4)", "strategy", 16, fwd_ms=100.0, train_ms=400.0),
            Row("atlas", "s(C=4)", "strategy", 32, status="skipped")]
    out = cost_rows(rows, rule, lambda r: 4, sizes, rate=1e9)
    assert len(out) == 1
    (c,) = out
    macs = sum(macs_per_token(rule, 4).values()) * 2
    assert c["fwd_tok_s"] == pytest.approx(2 * 16 / 0.1)
    assert c["fwd_bound_tok_s"] == pytest.approx(1e9 / macs)
    assert c["train_bound_tok_s"] == pytest.approx(1e9 / (TRAIN_FACTOR * macs))
    assert c["train_ratio"] == pytest.approx(c["train_tok_s"] / c["train_bound_tok_s"])


def test_matmul_rate_is_positive_and_atlas_long_is_validated():
    rule = get_case("atlas").rule(1, 4, 4)
    assert matmul_rate(rule, 2, 1, 1, repeats=1) > 0
    with pytest.raises(ValueError, match="atlas_long"):
        BenchConfig(rules=["atlas"], atlas_long=[0]).validate()


def test_atlas_long_rows_report_time_and_peak_memory():
    from atlas_core.bench.runner import long_memory_rows

    cfg = BenchConfig(rules=["atlas"], lengths=[8], batch=1, heads=1, dim=4, atlas_long=[40, 20])
    said = []
    rows = long_memory_rows(cfg, said.append)
    assert [r.T for r in rows] == [20, 40]
    for r in rows:
        assert r.status == "ok" and r.group == "long" and r.subject.startswith("auto: atlas_muon:atlas_parallel")
        assert r.train_ms > 0 and r.peak_train_mib > 0
    assert len(said) == 2
