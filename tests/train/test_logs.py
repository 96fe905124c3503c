"""What a person reads on stderr during `atlas train`: a start line, one line per evaluation, a
warning for a long run, a summary line; the same lines whether or not stderr is a terminal."""

from __future__ import annotations

import re

import pytest

from atlas_core.model import build_model
from atlas_core.spec import load_spec
from atlas_core.strategies.trust import parallel_note
from atlas_core.train import metrics as metrics_mod
from atlas_core.train import report as report_mod, trainer as trainer_mod
from atlas_core.train.metrics import duration, read_metrics
from atlas_core.train.setup import TrainOptions
from atlas_core.train.launch import train


def _lines(capfd) -> list[str]:
    return [line for line in capfd.readouterr().err.splitlines() if line.strip()]


def _train(tmp_path, spec, name="run", progress=False):
    out = tmp_path / name
    return out, train(TrainOptions(spec=spec, out=str(out), progress=progress))


def test_duration_reads_like_a_clock():
    assert duration(0.4) == "0 s"
    assert duration(42) == "42 s"
    assert duration(185) == "3 min 05 s"
    assert duration(2 * 3600 + 7 * 60 + 20) == "2 h 07 min"


def test_a_run_logs_start_every_evaluation_and_a_summary(tmp_path, tiny_spec, capfd):
    out, result = _train(tmp_path, tiny_spec)  # 6 steps, evaluations at 3 and 6 (the end)
    lines = _lines(capfd)
    n_params = sum(p.numel() for p in build_model(load_spec(tiny_spec)).parameters())
    strategy = parallel_note(load_spec(tiny_spec).memory["parallel"])  # e.g. core:chunkwise (atlas-ttm 0.1.0)
    assert lines[0] == (f"train: run {out}, {n_params:,} parameters on cpu, fp32, 1 thread "
                        f"(train.threads); 6 steps of "
                        f"4 x 16 tokens; {strategy}")
    evals = [r for r in read_metrics(out / "metrics.jsonl") if r["kind"] == "eval"]
    eval_lines = [line for line in lines if line.startswith("step ")]
    assert [int(re.match(r"step (\d+)/6:", line).group(1)) for line in eval_lines] == [3, 6]
    for line, rec in zip(eval_lines, evals):
        assert f"eval loss {rec['loss']:.4f}" in line
        assert f"accuracy {rec['accuracy']:.4f}" in line
        assert f"perplexity {rec['perplexity']:.3f}" in line
        assert "train loss " in line
    last = lines[-1]
    assert last.startswith("done: 6 steps in ") and "tokens/s" in last
    assert f"accuracy {result['accuracy']:.4f}" in last
    assert last.endswith(f"checkpoint {result['checkpoint']}")
    assert (out / "checkpoints").is_dir() and result["checkpoint"].startswith(str(out))
    # nothing else: no progress-bar remnants when stderr is not a terminal
    assert len(lines) == 4, lines


def test_the_same_lines_when_stderr_is_a_terminal(tmp_path, tiny_spec, capfd, monkeypatch):
    _train(tmp_path, tiny_spec, "plain", progress=True)  # stderr is a pipe: no bar
    plain = _lines(capfd)
    monkeypatch.setattr(trainer_mod, "is_terminal", lambda stream: True)
    _train(tmp_path, tiny_spec, "tty", progress=True)
    tty = _lines(capfd)

    def strip(lines):  # the run directory and timings differ between the runs
        keep = [l for l in lines if l.startswith(("train: run", "done: "))
                or (l.startswith("step ") and "eval loss" in l)]  # not the bar's own "step" row
        return [re.sub(r"\d+ s\b|[\d,]+ tokens/s|/\S+", "#", l) for l in keep]

    assert strip(tty) == strip(plain) and len(strip(plain)) == 4


def test_a_long_run_is_warned_about_after_its_first_steps(tmp_path, tiny_spec, capfd, monkeypatch):
    monkeypatch.setattr(report_mod, "LONG_RUN_S", 0.0)  # every run counts as long
    out, _ = _train(tmp_path, tiny_spec)
    lines = _lines(capfd)
    warnings = [line for line in lines if line.startswith("warning: this run is projected")]
    assert len(warnings) == 1
    assert "steps left" in warnings[0] and "lower --steps" in warnings[0]
    # printed at step 4 (three steps after the first), before the final evaluation
    assert lines.index(warnings[0]) < lines.index(next(l for l in lines if l.startswith("step 6/6")))
    (est,) = [r for r in read_metrics(out / "metrics.jsonl") if r.get("event") == "estimate"]
    assert est["step"] == 4 and est["projected_s"] > 0 and est["seconds_per_step"] > 0


def test_a_short_run_is_not_warned_about(tmp_path, tiny_spec, capfd):
    out, _ = _train(tmp_path, tiny_spec)
    assert not any(l.startswith("warning:") for l in _lines(capfd))
    (est,) = [r for r in read_metrics(out / "metrics.jsonl") if r.get("event") == "estimate"]
    assert est["projected_s"] < metrics_mod.LONG_RUN_S


def test_estimate_line_states_the_projection():
    line = metrics_mod.estimate_line(2 * 3600, 13.5, 75.0, 1991)
    assert line.startswith("warning: this run is projected to take 2 h 00 min")
    assert "1,991 steps left at 13.50 s/step, 75 tokens/s" in line


def test_a_resumed_run_says_which_steps_it_trains(tmp_path, tiny_spec, capfd):
    from atlas_core.train.errors import TrainingInterrupted

    def stop(t):
        if t.step == 2:
            t.request_stop()

    out = tmp_path / "run"
    with pytest.raises(TrainingInterrupted):
        train(TrainOptions(spec=tiny_spec, out=str(out), progress=False), on_step=stop)
    capfd.readouterr()
    train(TrainOptions(resume=str(out), progress=False))
    first = _lines(capfd)[0]
    assert first.startswith(f"train: run {out}, ") and "steps 3-6 of 6 of 4 x 16 tokens; parallel: " in first


def test_a_run_shorter_than_its_warmup_is_warned_about(tmp_path, tiny_spec, capfd):
    """titans_lmm with --steps 40 (warm-up 100) never reached its peak rate without a word: the
    line after the start line says so, with the rate it reaches and what to change."""
    tiny_spec["train"].update(steps=3, warmup_steps=10, eval_every=0, lr=2e-3)
    _train(tmp_path, tiny_spec)
    lines = _lines(capfd)
    assert lines[1] == ("warning: train.warmup_steps = 10 is more than the run's 3 steps: the "
                        "learning rate rises only to 0.0006 of its peak lr = 0.002 and never "
                        "decays; lower train.warmup_steps (e.g. train.warmup_steps=1) or raise "
                        "--steps"), lines
    tiny_spec["train"].update(warmup_steps=3)  # the peak is reached at the last step: no word
    _train(tmp_path, tiny_spec, name="enough")
    assert not [ln for ln in _lines(capfd) if "warm" in ln]
