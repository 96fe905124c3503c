"""How the benchmark turns runs into one time: the fastest run, two runs for a slow subject.

The clock is scripted, so the test checks the rule, not this machine's speed."""

import pytest

from atlas_core.bench import runner


@pytest.fixture
def clock(monkeypatch):
    """perf_counter advances by the next scripted duration on every second call (end of a run)."""
    state = {"now": 0.0, "calls": 0, "durations": []}

    def perf_counter():
        state["calls"] += 1
        if state["calls"] % 2 == 0:
            state["now"] += state["durations"].pop(0)
        return state["now"]

    monkeypatch.setattr(runner.time, "perf_counter", perf_counter)
    return state


def test_fast_subject_reports_the_fastest_of_warmup_and_repeats(clock):
    clock["durations"] = [0.9, 0.30, 0.20, 0.25]  # cold first run, then three warm ones
    calls = []
    t, runs = runner._timed(lambda: calls.append(1), repeats=3, slow_s=5.0)
    assert (t, runs, len(calls)) == (pytest.approx(0.20), 4, 4)


def test_slow_subject_gets_one_more_run_and_a_cold_first_run_is_not_reported(clock):
    clock["durations"] = [12.0, 3.0]  # the first run paid for fresh memory pages
    calls = []
    t, runs = runner._timed(lambda: calls.append(1), repeats=3, slow_s=5.0)
    assert (t, runs, len(calls)) == (pytest.approx(3.0), 2, 2)
