"""Data parallelism: 2 gloo processes on the CPU follow the 1-process loss trajectory."""

from __future__ import annotations

import pytest
import torch

from atlas_core.errors import SpecError
from atlas_core.train.checkpoint import load_checkpoint
from atlas_core.train.metrics import read_metrics
from atlas_core.train.setup import TrainOptions
from atlas_core.train.trainer import train


def _trajectory(run_dir):
    return [(r["step"], r["loss"], r["grad_norm"]) for r in read_metrics(run_dir / "metrics.jsonl")
            if r["kind"] == "train"]


def test_two_processes_match_one_with_the_same_global_batch(tmp_path, tiny_spec):
    tiny_spec["train"].update(steps=5, eval_every=0)
    one, two = tmp_path / "one", tmp_path / "two"
    r1 = train(TrainOptions(spec=tiny_spec, out=str(one), progress=False), nproc=1)
    r2 = train(TrainOptions(spec=tiny_spec, out=str(two), progress=False), nproc=2)
    assert r2["world_size"] == 2 and r1["world_size"] == 1
    a, b = _trajectory(one), _trajectory(two)
    assert [s for s, *_ in a] == [s for s, *_ in b] == [1, 2, 3, 4, 5]
    for (_, la, ga), (_, lb, gb) in zip(a, b):
        assert lb == pytest.approx(la, rel=1e-5, abs=1e-6)
        assert gb == pytest.approx(ga, rel=1e-4, abs=1e-6)
    assert r2["accuracy"] == pytest.approx(r1["accuracy"])
    assert r2["eval_loss"] == pytest.approx(r1["eval_loss"], rel=1e-5)
    wa, wb = load_checkpoint(one).model_tensors(), load_checkpoint(two).model_tensors()
    for k in wa:
        torch.testing.assert_close(wb[k], wa[k], rtol=1e-4, atol=1e-5)
    # only rank 0 wrote: one metrics file, one checkpoint, one start record
    starts = [r for r in read_metrics(two / "metrics.jsonl") if r.get("event") == "start"]
    assert len(starts) == 1 and starts[0]["world_size"] == 2


def test_batch_must_split_evenly(tmp_path, tiny_spec):
    tiny_spec["train"]["batch_size"] = 5
    with pytest.raises(SpecError, match=r"train\.batch_size: must be divisible by the 2 processes"):
        train(TrainOptions(spec=tiny_spec, out=str(tmp_path / "r"), progress=False), nproc=2)
    assert not (tmp_path / "r").exists()
