"""Data parallelism on torch's engines: 2 gloo processes on the CPU equal 1 process.

- DDP: 20 steps with the global batch split over 2 processes end at the parameters of 20 steps in
  one process (float32, to 1e-6), with the same loss trajectory;
- FSDP2 (``shard="fsdp"``): the same run, sharded, ends at the same parameters; its checkpoint
  (gathered on rank 0) loads in a single process, and greedy decoding there gives the tokens the
  sharded model gave. FSDP starts runs; resuming one under FSDP is refused (resume with DDP).
"""

from __future__ import annotations

import pytest
import torch

from atlas_core.errors import SpecError
from atlas_core.train import data_parallel as distributed
from atlas_core.train.checkpoint import load_checkpoint
from atlas_core.train.inference import open_checkpoint
from atlas_core.train.metrics import read_metrics
from atlas_core.train.setup import TrainOptions, make_plan
from atlas_core.train.launch import train
from atlas_core.train.trainer import Trainer

STEPS = 20
PROMPT = [[1, 2, 3, 4, 5, 6, 7, 8]]


def _trajectory(run_dir):
    return [(r["step"], r["loss"]) for r in read_metrics(run_dir / "metrics.jsonl")
            if r["kind"] == "train"]


def _train_and_generate(opts: TrainOptions, info) -> dict:
    """A spawned rank: train (sharded), then decode greedily with the sharded model."""
    trainer = Trainer(make_plan(opts, world=info.world), info, progress=False, shard=opts.shard)
    result = trainer.run()
    trainer.model.eval()
    tokens = trainer.model.generate(torch.tensor(PROMPT), 8, greedy=True)
    return {**result, "tokens": tokens.tolist()}


@pytest.fixture
def spec(tiny_spec):
    tiny_spec["train"].update(steps=STEPS, eval_every=0, checkpoint_every=0)
    return tiny_spec


def _assert_same_weights(a, b, atol):
    wa, wb = load_checkpoint(a).model_tensors(), load_checkpoint(b).model_tensors()
    assert sorted(wa) == sorted(wb)
    for k in wa:
        torch.testing.assert_close(wb[k], wa[k], rtol=0, atol=atol, msg=k)


def test_ddp_and_fsdp_on_two_processes_match_one(tmp_path, spec, capfd):
    one, ddp, fsdp = tmp_path / "one", tmp_path / "ddp", tmp_path / "fsdp"
    r1 = train(TrainOptions(spec=spec, out=str(one), progress=False), nproc=1)
    capfd.readouterr()
    r2 = train(TrainOptions(spec=spec, out=str(ddp), progress=False), nproc=2)
    assert (r1["world_size"], r2["world_size"]) == (1, 2)
    # the start line (rank 0's only) says how many processes share the work, and how
    starts = [ln for ln in capfd.readouterr().err.splitlines() if ln.startswith("train: run")]
    assert len(starts) == 1 and " on cpu x 2 processes (data parallel, ddp), " in starts[0], starts
    assert " thread each (" in starts[0] or " threads each (" in starts[0], starts
    a, b = _trajectory(one), _trajectory(ddp)
    assert [s for s, _ in a] == [s for s, _ in b] == list(range(1, STEPS + 1))
    for (_, la), (_, lb) in zip(a, b):
        assert lb == pytest.approx(la, rel=1e-6, abs=1e-7)
    _assert_same_weights(one, ddp, 1e-6)
    # only rank 0 wrote: one start record
    starts = [r for r in read_metrics(ddp / "metrics.jsonl") if r.get("event") == "start"]
    assert len(starts) == 1 and starts[0]["world_size"] == 2

    opts = TrainOptions(spec=spec, out=str(fsdp), progress=False, shard="fsdp")
    plan = make_plan(opts, world=2)
    r3 = distributed.spawn(_train_and_generate,
                           TrainOptions(**{**opts.__dict__, "spec": plan.spec.to_dict(),
                                           "run_dir_checked": True}), 2, "cpu")
    _assert_same_weights(one, fsdp, 1e-6)
    _, model, _ = open_checkpoint(r3["checkpoint"], device="cpu")
    single = model.generate(torch.tensor(PROMPT), 8, greedy=True).tolist()
    assert single == r3["tokens"]
    assert len(single[0]) == len(PROMPT[0]) + 8


def test_batch_must_split_evenly(tmp_path, tiny_spec):
    tiny_spec["train"]["batch_size"] = 5
    with pytest.raises(SpecError, match=r"train\.batch_size: must be divisible by the 2 processes"):
        train(TrainOptions(spec=tiny_spec, out=str(tmp_path / "r"), progress=False), nproc=2)
    assert not (tmp_path / "r").exists()


def test_fsdp_needs_several_processes(tmp_path, tiny_spec):
    with pytest.raises(ValueError, match=r"--shard fsdp splits the model over processes"):
        train(TrainOptions(spec=tiny_spec, out=str(tmp_path / "r"), progress=False,
                           shard="fsdp"), nproc=1)
    with pytest.raises(ValueError, match=r"--shard 'zero' is not an engine; use one of ddp, fsdp"):
        train(TrainOptions(spec=tiny_spec, out=str(tmp_path / "r"), progress=False,
                           shard="zero"), nproc=2)
    with pytest.raises(ValueError, match=r"--shard fsdp does not resume runs; resume .* with "
                                         r"--shard ddp"):
        train(TrainOptions(spec=tiny_spec, resume=str(tmp_path / "r"), progress=False,
                           shard="fsdp"), nproc=2)
    assert not (tmp_path / "r").exists()


def _repeat_script():
    import importlib.util
    from pathlib import Path

    path = Path(__file__).resolve().parents[2] / "scripts" / "repeat_torchrun.py"
    spec = importlib.util.spec_from_file_location("repeat_torchrun", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_torchrun_runs_end_cleanly_every_time():
    """3 short torchrun launches of 2 processes (scripts/repeat_torchrun.py runs 20): each exits
    0 with rank 0's summary line, the curve, the final checkpoint and the end record."""
    records = _repeat_script().repeat(3, "torchrun", steps=3, timeout=240, echo=lambda line: None)
    assert [r["problems"] for r in records] == [[], [], []]
