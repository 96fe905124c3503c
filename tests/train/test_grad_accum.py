"""Gradient accumulation (``[train] grad_accum``, ``--grad-accum``): N micro-batches of
``batch_size`` rows per optimizer step learn exactly what one batch of N x batch_size rows does.

In float64 (where the order of the sums no longer shows), one step of grad_accum = 4 x batch 8
ends at the weights and AdamW moments of one step of batch 32, in one process and in two DDP
processes (gloo on the CPU); DDP exchanges gradients once per step (after the last
micro-batch), counted by a communication hook; FSDP2 accumulates as well (float32, to
rounding); the log and the checkpoints count optimizer steps.
"""

from __future__ import annotations

import contextlib
import json

import pytest
import torch

from atlas_core.train import data_parallel as distributed
from atlas_core.train.checkpoint import load_checkpoint
from atlas_core.train.launch import train
from atlas_core.train.metrics import read_metrics
from atlas_core.train.setup import TrainOptions, make_plan
from atlas_core.train.trainer import Trainer


@contextlib.contextmanager
def float64():
    before = torch.get_default_dtype()
    torch.set_default_dtype(torch.float64)
    try:
        yield
    finally:
        torch.set_default_dtype(before)


def _spec(tiny_spec, batch_size, grad_accum, steps=1, task=None):
    spec = {**tiny_spec, "train": {**tiny_spec["train"], "batch_size": batch_size,
                                   "grad_accum": grad_accum, "steps": steps, "eval_every": 0,
                                   "warmup_steps": 0, "log_every": 1}}
    if task is not None:
        spec["train"]["task"] = task
    return spec


def _weights(run_dir):
    """The weights and AdamW's moments after the step (``exp_avg`` is 0.1 x the gradient after
    one step: the weights alone would hide a gradient off by a constant factor, which Adam's
    first update does not see)."""
    ckpt = load_checkpoint(run_dir)
    return {**ckpt.model_tensors(), **ckpt.optimizer_state()[0]}


def _assert_same(a, b, atol=1e-12):
    assert sorted(a) == sorted(b)
    for k in a:
        assert a[k].dtype == torch.float64 or k.endswith("/step"), k
        torch.testing.assert_close(b[k], a[k], rtol=0, atol=atol, msg=k)


def _train_records(run_dir):
    return [r for r in read_metrics(run_dir / "metrics.jsonl") if r["kind"] == "train"]


@pytest.fixture(params=["mqar", "text"])
def task(request, tmp_path):
    if request.param == "mqar":
        return None  # the tiny spec's MQAR
    corpus = tmp_path / "corpus.txt"
    corpus.write_text("the memory reads it back bit by bit " * 20)  # 15 characters
    return {"use": "text", "path": str(corpus), "mode": "char", "seq_len": 16}


def test_four_micro_batches_of_8_equal_one_batch_of_32(tmp_path, tiny_spec, task):
    with float64():
        big = tmp_path / "big"
        train(TrainOptions(spec=_spec(tiny_spec, 32, 1, task=task), out=str(big), progress=False))
        acc = tmp_path / "acc"
        train(TrainOptions(spec=_spec(tiny_spec, 8, 4, task=task), out=str(acc), progress=False))
        small = tmp_path / "small"
        train(TrainOptions(spec=_spec(tiny_spec, 8, 1, task=task), out=str(small), progress=False))
    wb, wa, ws = _weights(big), _weights(acc), _weights(small)
    _assert_same(wb, wa)
    assert any(not torch.allclose(wb[k], ws[k], rtol=0, atol=1e-6) for k in wb)  # 8 rows differ
    (rb,), (ra,) = _train_records(big), _train_records(acc)
    assert ra["loss"] == pytest.approx(rb["loss"], rel=1e-12)
    assert ra["accuracy"] == rb["accuracy"] and ra["grad_norm"] == pytest.approx(rb["grad_norm"], rel=1e-10)


def test_steps_tokens_and_the_start_line_count_optimizer_steps(tmp_path, tiny_spec, capfd):
    out = tmp_path / "run"
    result = train(TrainOptions(spec=_spec(tiny_spec, 4, 3, steps=2), out=str(out), progress=False))
    assert result["steps"] == 2
    assert [r["step"] for r in _train_records(out)] == [1, 2]
    ckpt = load_checkpoint(out)
    assert ckpt.step == 2 and ckpt.meta.tokens_seen == 2 * 3 * 4 * 16  # steps x N x rows x T
    start = next(ln for ln in capfd.readouterr().err.splitlines() if ln.startswith("train: run"))
    assert "2 steps of 3 x 4 x 16 tokens (3 micro-batches of 4 rows, gradients accumulated)" in start


def test_grad_accum_is_validated_and_set_by_the_flag(tmp_path, tiny_spec):
    from typer.testing import CliRunner

    from atlas_cli.main import make_app
    from atlas_core.spec import dump_toml

    spec = tmp_path / "tiny.toml"
    spec.write_text(dump_toml(_spec(tiny_spec, 4, 1)))
    runner = CliRunner()
    r = runner.invoke(make_app(plugin_apps=False), ["--format", "json", "spec", "validate",
                                                    str(spec), "train.grad_accum=0"])
    assert r.exit_code == 1 and json.loads(r.stdout)[0]["errors"][0]["path"] == "train.grad_accum"
    r = runner.invoke(make_app(plugin_apps=False), ["--format", "json", "train", str(spec),
                                                    "--grad-accum", "2", "--out",
                                                    str(tmp_path / "r"), "--no-progress"])
    assert r.exit_code == 0, r.output
    saved = (tmp_path / "r" / "spec.toml").read_text()
    assert "grad_accum = 2" in saved
    assert load_checkpoint(tmp_path / "r").meta.tokens_seen == 2 * 4 * 16


# -- two processes -----------------------------------------------------------------------------------
def _runs_on_two_ranks(payload, info) -> dict:
    """A spawned rank (one spawn for all the runs, the processes cost more than the runs): each
    run of ``payload`` ``(name, TrainOptions, dtype)``, counting DDP's gradient exchanges (one
    call of the communication hook per bucket of a backward that synchronises)."""
    from torch.distributed.algorithms.ddp_comm_hooks.default_hooks import allreduce_hook

    calls = {}
    for name, opts, dtype in payload:
        before = torch.get_default_dtype()
        torch.set_default_dtype(dtype)
        try:
            trainer = Trainer(make_plan(opts, world=info.world), info, progress=False,
                              shard=opts.shard)
            count = [0]

            def hook(state, bucket, count=count):
                count[0] += 1
                return allreduce_hook(state, bucket)

            if opts.shard == "ddp":
                trainer.forward.register_comm_hook(None, hook)
            trainer.run()
        finally:
            torch.set_default_dtype(before)
        calls[name] = count[0]
    return calls


def _opts(spec, out, shard="ddp"):
    opts = TrainOptions(spec=spec, out=str(out), progress=False, shard=shard)
    plan = make_plan(opts, world=2)
    return TrainOptions(**{**opts.__dict__, "spec": plan.spec.to_dict(), "run_dir_checked": True})


def test_ddp_and_fsdp_accumulate_with_one_gradient_exchange_per_step(tmp_path, tiny_spec):
    with float64():
        train(TrainOptions(spec=_spec(tiny_spec, 32, 1), out=str(tmp_path / "big"), progress=False))
    train(TrainOptions(spec=_spec(tiny_spec, 32, 1), out=str(tmp_path / "big32"), progress=False))
    calls = distributed.spawn(_runs_on_two_ranks, [
        ("acc", _opts(_spec(tiny_spec, 8, 4), tmp_path / "acc"), torch.float64),
        ("once", _opts(_spec(tiny_spec, 32, 1), tmp_path / "once"), torch.float64),
        ("fsdp", _opts(_spec(tiny_spec, 8, 4), tmp_path / "fsdp", "fsdp"), torch.float32),
    ], 2, "cpu")
    _assert_same(_weights(tmp_path / "big"), _weights(tmp_path / "acc"))
    # the step without accumulation exchanges as often as one backward does: so does this one
    assert calls["once"] >= 1 and calls["acc"] == calls["once"], calls
    (ra,), (rb,) = _train_records(tmp_path / "acc"), _train_records(tmp_path / "big")
    assert ra["step"] == 1 and ra["loss"] == pytest.approx(rb["loss"], rel=1e-12)
    # FSDP2: every micro-batch but the last skips the reduce-scatter (set_requires_gradient_sync);
    # the step is batch 32's (float32, to rounding)
    a, b = _weights(tmp_path / "big32"), _weights(tmp_path / "fsdp")
    assert sorted(a) == sorted(b)
    for k in a:
        torch.testing.assert_close(b[k], a[k], rtol=0, atol=2e-6, msg=k)
