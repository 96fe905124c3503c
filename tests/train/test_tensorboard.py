"""`[train] tensorboard = true`: TensorBoard event files beside metrics.jsonl, with the same
numbers."""

from __future__ import annotations

import pytest

from atlas_core.errors import SpecError
from atlas_core.train.metrics import METRICS_FILE, read_metrics
from atlas_core.train.params import TrainParams
from atlas_core.train.tensorboard import TB_DIR

event_accumulator = pytest.importorskip(
    "tensorboard.backend.event_processing.event_accumulator",
    reason="the tensorboard package (extra 'tensorboard') reads the event files back")


def test_events_mirror_the_metrics(tmp_path, tiny_spec):
    from atlas_core.api import train

    tiny_spec["train"].update(tensorboard=True, steps=6, log_every=2, eval_every=3)
    run = train(tiny_spec, out=str(tmp_path / "run"), progress=False)
    run_dir = tmp_path / "run"
    acc = event_accumulator.EventAccumulator(str(run_dir / TB_DIR))
    acc.Reload()
    records = read_metrics(run_dir / METRICS_FILE)
    evals = [r for r in records if r["kind"] == "eval"]
    trains = [r for r in records if r["kind"] == "train"]
    assert evals and trains and run is not None
    got = {e.step: e.value for e in acc.Scalars("eval/loss")}
    assert got == pytest.approx({r["step"]: r["loss"] for r in evals}, rel=1e-6)
    got = {e.step: e.value for e in acc.Scalars("train/loss")}
    assert got == pytest.approx({r["step"]: r["loss"] for r in trains}, rel=1e-6)
    assert {"eval/accuracy", "eval/perplexity", "train/lr"} <= set(acc.Tags()["scalars"])


def test_tensorboard_flag_is_a_strict_bool():
    with pytest.raises(SpecError, match="tensorboard"):
        TrainParams.model_validate({"task": "mqar", "tensorboard": "yes"})
