"""``atlas train --context-parallel 2``: each sequence split along time over 2 gloo processes
trains as one process does (same loss trajectory and weights, float32)."""

from __future__ import annotations

import copy

import pytest
import torch

from atlas_core.errors import SpecError
from atlas_core.train.checkpoint import load_checkpoint
from atlas_core.train.metrics import read_metrics
from atlas_core.train.setup import TrainOptions
from atlas_core.train.launch import train

SPEC = {
    "schema": "atlas/1",
    "name": "cp",
    "model": {"arch": "core:lm", "vocab_size": 16, "d_model": 16, "depth": 1, "heads": 2,
              "mlp_ratio": 2.0},
    "memory": {"use": "titans:titans"},
    "train": {"task": {"use": "mqar", "num_pairs": 2, "seq_len": 16}, "steps": 4,
              "batch_size": 4, "lr": 3e-3, "warmup_steps": 2, "eval_every": 0,
              "eval_batches": 1, "log_every": 1, "seed": 0, "device": "cpu"},
}


def _losses(run_dir):
    return [r["loss"] for r in read_metrics(run_dir / "metrics.jsonl") if r["kind"] == "train"]


def test_two_slices_train_as_one_process(tmp_path):
    one, two = tmp_path / "one", tmp_path / "two"
    r1 = train(TrainOptions(spec=copy.deepcopy(SPEC), out=str(one), progress=False))
    r2 = train(TrainOptions(spec=copy.deepcopy(SPEC), out=str(two), progress=False,
                            context_parallel=2))
    assert r2["world_size"] == 2
    assert _losses(two) == pytest.approx(_losses(one), rel=1e-5)
    assert r2["eval_loss"] == pytest.approx(r1["eval_loss"], rel=1e-5)
    wa, wb = load_checkpoint(one).model_tensors(), load_checkpoint(two).model_tensors()
    for k in wa:
        torch.testing.assert_close(wb[k], wa[k], rtol=1e-5, atol=1e-6, msg=k)


def test_launch_errors(tmp_path):
    out = str(tmp_path / "r")
    with pytest.raises(ValueError, match=r"--context-parallel 2 splits each sequence over all "
                                         r"the processes, and this run has 3"):
        train(TrainOptions(spec=copy.deepcopy(SPEC), out=out, progress=False,
                           context_parallel=2), nproc=3)
    with pytest.raises(ValueError, match=r"--context-parallel runs with --shard ddp"):
        train(TrainOptions(spec=copy.deepcopy(SPEC), out=out, progress=False,
                           context_parallel=2, shard="fsdp"))
    spec = copy.deepcopy(SPEC)
    spec["model"]["arch"] = "titans:mag"
    with pytest.raises(SpecError, match=r"model\.arch: --context-parallel splits sequences"):
        train(TrainOptions(spec=spec, out=out, progress=False, context_parallel=2))
    spec = copy.deepcopy(SPEC)
    spec["train"]["task"]["seq_len"] = 8
    with pytest.raises(SpecError, match=r"train\.seq_len: a sequence of 8 tokens split over 4"):
        train(TrainOptions(spec=spec, out=out, progress=False, context_parallel=4))
    spec = copy.deepcopy(SPEC)
    spec.setdefault("layer", {})["rotary"] = True  # positions would restart at every slice
    with pytest.raises(SpecError, match=r"layer\.rotary: context parallelism runs each slice from position 0"):
        train(TrainOptions(spec=spec, out=out, progress=False, context_parallel=2))
    assert not (tmp_path / "r").exists()


def test_enable_refuses_rotary_layers():
    import atlas_core as ac
    from atlas_core.distributed.lm import enable

    model = ac.build_model({"schema": "atlas/1", "name": "rot", "memory": {"use": "zoo:retnet"},
                            "model": {"arch": "core:lm", "vocab_size": 16, "d_model": 16, "depth": 1,
                                      "heads": 2},
                            "layer": {"rotary": True}})
    with pytest.raises(SpecError, match=r"layer\.rotary: context parallelism runs each slice"):
        enable(model)
