"""`atlas bench` benchmarks a third-party strategy only when asked to, as ``"auto"`` chooses one.

With atlas-acme-greedy installed (``greedy:zeros`` claims every rule): the default subjects of a
case are the bundled strategies; naming the strategy or allowing its namespace adds it.
"""

from __future__ import annotations

from atlas_core.bench import runner
from atlas_core.bench.cases import get_case
from atlas_core.strategies import trust


def _names(config):
    return {s.strategy for s in runner.default_subjects(config, get_case("titans"))}


def test_default_subjects_leave_out_third_party_strategies(greedy, monkeypatch, capsys):
    monkeypatch.setattr(runner, "_noted", set())
    names = _names(runner.BenchConfig(lengths=[16], chunk=8))
    assert "greedy:zeros" not in names
    assert {"core:sequential", "core:chunkwise"} <= names
    err = capsys.readouterr().err
    assert "not benchmarked: greedy:zeros" in err and "third-party" in err and trust.ALLOW_ENV in err


def test_named_or_allowed_third_party_strategy_is_benchmarked(greedy, monkeypatch):
    assert "greedy:zeros" in _names(runner.BenchConfig(lengths=[16], chunk=8,
                                                       strategies=["greedy:zeros", "core:sequential"]))
    monkeypatch.setenv(trust.ALLOW_ENV, "greedy")
    assert "greedy:zeros" in _names(runner.BenchConfig(lengths=[16], chunk=8))
