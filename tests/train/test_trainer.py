"""The training loop: resume exactness, Ctrl-C, the schedule, evaluation, bad input."""

from __future__ import annotations

import math
import os
import signal

import pytest
import torch
import torch.nn.functional as F

from atlas_core.errors import SpecError
from atlas_core.train.checkpoint import CheckpointError, load_checkpoint
from atlas_core.train.evaluate import build_task, evaluate
from atlas_core.train.metrics import read_metrics
from atlas_core.train.optim import lr_at
from atlas_core.train.params import train_params
from atlas_core.train.setup import RunDirError, TrainOptions
from atlas_core.train.tasks import TaskDataError, TaskFileNotFoundError
from atlas_core.train.errors import TrainingInterrupted
from atlas_core.train.launch import train
from atlas_core.train.trainer import Trainer


def _losses(run_dir):
    return [(r["step"], r["loss"]) for r in read_metrics(run_dir / "metrics.jsonl")
            if r["kind"] == "train"]


def _weights(run_dir):
    ckpt = load_checkpoint(run_dir)
    return ckpt.step, ckpt.model_tensors()


def _stop_at(step):
    def hook(trainer: Trainer):
        if trainer.step == step:
            trainer.request_stop()
    return hook


def test_resume_continues_exactly(tmp_path, tiny_spec):
    """6 steps uninterrupted == 4 steps, stop (the Ctrl-C path), resume for the last 2."""
    full = tmp_path / "full"
    train(TrainOptions(spec=tiny_spec, out=str(full), progress=False))

    part = tmp_path / "part"
    with pytest.raises(TrainingInterrupted) as info:
        train(TrainOptions(spec=tiny_spec, out=str(part), progress=False), on_step=_stop_at(4))
    assert info.value.step == 4
    assert load_checkpoint(part).step == 4
    train(TrainOptions(resume=str(part), progress=False))

    a, b = _losses(full), _losses(part)
    assert [s for s, _ in a] == list(range(1, 7))
    assert a == b  # bitwise: same data, same optimiser state, same RNG
    step_a, wa = _weights(full)
    step_b, wb = _weights(part)
    assert step_a == step_b == 6
    assert all(torch.equal(wa[k], wb[k]) for k in wa)
    evals = [r for r in read_metrics(part / "metrics.jsonl") if r["kind"] == "eval"]
    assert [r["step"] for r in evals] == [3, 6]


def test_sigint_saves_and_stops(tmp_path, tiny_spec):
    """A real SIGINT (Ctrl-C) stops after the current step with a checkpoint of that step."""
    def hook(trainer):
        if trainer.step == 2:
            os.kill(os.getpid(), signal.SIGINT)

    out = tmp_path / "run"
    before = signal.getsignal(signal.SIGINT)
    with pytest.raises(TrainingInterrupted, match="interrupted at step 2"):
        train(TrainOptions(spec=tiny_spec, out=str(out), progress=False), on_step=hook)
    assert signal.getsignal(signal.SIGINT) is before  # the handler is restored
    assert load_checkpoint(out).step == 2
    events = [r.get("event") for r in read_metrics(out / "metrics.jsonl") if r["kind"] == "run"]
    assert events == ["start", "interrupt"]


def test_resume_extends_steps_and_truncates_the_log(tmp_path, tiny_spec):
    out = tmp_path / "run"
    train(TrainOptions(spec=tiny_spec, out=str(out), progress=False))
    result = train(TrainOptions(resume=str(out), steps=8, progress=False))
    assert result["steps"] == 8
    steps = [s for s, _ in _losses(out)]
    assert steps == list(range(1, 9))


def test_resuming_a_complete_run_trains_nothing_and_returns_its_result(tmp_path, tiny_spec, capsys):
    """A requeued job (--resume of a run whose last step is saved and evaluated) succeeds."""
    out = tmp_path / "run"
    first = train(TrainOptions(spec=tiny_spec, out=str(out), progress=False))
    log_before = (out / "metrics.jsonl").read_text()
    capsys.readouterr()
    again = train(TrainOptions(resume=str(out), progress=False))
    err = capsys.readouterr().err
    assert f"the run {out} is complete (step 6 of 6 saved and evaluated)" in err
    assert f"atlas train --resume {out} --steps N with N > 6" in err
    assert again["complete"] is True and again["steps"] == first["steps"] == 6
    for key in ("accuracy", "eval_loss", "perplexity", "eval_tokens", "checkpoint", "run_dir"):
        assert again[key] == first[key], key
    assert (out / "metrics.jsonl").read_text() == log_before  # nothing written
    # asking for fewer steps than the run trained is still an error
    with pytest.raises(CheckpointError, match="nothing left to train; pass --steps N with N > 6"):
        train(TrainOptions(resume=str(out), steps=2, progress=False))


def test_fresh_run_never_overwrites(tmp_path, tiny_spec):
    out = tmp_path / "run"
    train(TrainOptions(spec=tiny_spec, out=str(out), progress=False))
    before = {p: p.read_bytes() for p in out.rglob("*") if p.is_file()}
    with pytest.raises(RunDirError, match="already holds a run"):
        train(TrainOptions(spec=tiny_spec, out=str(out), progress=False))
    after = {p: p.read_bytes() for p in out.rglob("*") if p.is_file()}
    assert before == after


def test_resume_with_a_different_model_is_refused(tmp_path, tiny_spec):
    out = tmp_path / "run"
    train(TrainOptions(spec=tiny_spec, out=str(out), progress=False))
    other = dict(tiny_spec, model={**tiny_spec["model"], "d_model": 32})
    with pytest.raises(CheckpointError, match=r"different model .*model\.d_model: 16 in the checkpoint, 32 here") as err:
        train(TrainOptions(spec=other, resume=str(out), steps=9, progress=False))
    # the fix fits a SPEC and an override alike (a resume without SPEC changes the model only by
    # an override): it does not tell a user who gave no SPEC to omit it
    assert "omit" not in str(err.value)
    assert "no SPEC, and no override of [model], [memory] or [layer]" in str(err.value)


def test_lr_schedule_warmup_then_cosine():
    p = train_params({"steps": 10, "lr": 1.0, "min_lr": 0.1, "warmup_steps": 4})
    assert [lr_at(s, p) for s in range(4)] == [0.25, 0.5, 0.75, 1.0]
    assert lr_at(4, p) == pytest.approx(1.0)
    assert lr_at(9, p) == pytest.approx(0.1)
    mid = 4 + (9 - 4) / 2
    assert lr_at(int(mid * 2) // 2, p) < 1.0
    # the cosine at a quarter of the decay: min + (max - min) * (1 + cos(pi / 4)) / 2
    p2 = train_params({"steps": 9, "lr": 1.0, "min_lr": 0.0, "warmup_steps": 0})
    assert lr_at(2, p2) == pytest.approx((1 + math.cos(math.pi / 4)) / 2)


def test_evaluate_matches_a_hand_computation(tiny_spec):
    from atlas_core.model import build_model

    torch.manual_seed(0)
    model = build_model(tiny_spec)
    task = build_task(tiny_spec["train"]["task"], 16)
    got = evaluate(model, task, batches=2, batch_size=3, seed=5)
    gen = torch.Generator().manual_seed(5 + 1_000_003)
    ce = hits = count = 0.0
    with torch.no_grad():
        for _ in range(2):
            x, y = task.batch(3, gen)
            logits = model(x)
            keep = y != -100
            ce += F.cross_entropy(logits[keep], y[keep], reduction="sum").item()
            hits += (logits.argmax(-1)[keep] == y[keep]).sum().item()
            count += keep.sum().item()
    assert got["tokens"] == count == 2 * 3 * 2  # num_pairs = 2 queries per row
    assert got["loss"] == pytest.approx(ce / count, rel=1e-6)
    assert got["accuracy"] == pytest.approx(hits / count)
    assert got["perplexity"] == pytest.approx(math.exp(ce / count), rel=1e-6)


def test_task_vocab_defaults_to_the_model_and_must_fit(tiny_spec):
    task = build_task({"use": "mqar", "num_pairs": 2, "seq_len": 16}, 16)
    assert task.vocab_size == 16
    with pytest.raises(SpecError, match=r"model\.vocab_size.*uses 64 token ids.*set model.vocab_size = 64"):
        build_task({"use": "mqar", "num_pairs": 2, "seq_len": 16, "vocab_size": 64}, 16)


# -- bad input: one clear error each, nothing written ------------------------------------------------
@pytest.mark.parametrize(
    "task, error, pattern",
    [
        ({"use": "text", "path": "no/such/file.txt"}, TaskFileNotFoundError, "no such file"),
        ({"use": "text", "path": "EMPTY"}, TaskDataError, "is empty"),
        ({"use": "text", "path": "SHORT", "seq_len": 64}, TaskDataError, "seq_len=64 needs at least"),
        ({"use": "mqar", "num_pairs": 8, "seq_len": 16}, SpecError, r"train\.task\.num_pairs: num_pairs=8 needs seq_len >= 4 \* num_pairs = 32"),
        ("mqr", SpecError, r"unknown task .*did you mean 'mqar'"),
    ],
    ids=["missing-file", "empty-file", "seq-len-too-long", "mqar-seq-len", "unknown-task"],
)
def test_bad_task_input(tmp_path, tiny_spec, task, error, pattern):
    (tmp_path / "empty.txt").write_text("")
    (tmp_path / "short.txt").write_text("hello world\n")
    if isinstance(task, dict) and task.get("path") in ("EMPTY", "SHORT"):
        task = {**task, "path": str(tmp_path / f"{task['path'].lower()}.txt")}
    tiny_spec["train"]["task"] = task
    tiny_spec["model"]["vocab_size"] = 256
    out = tmp_path / "run"
    with pytest.raises(error, match=pattern):
        train(TrainOptions(spec=tiny_spec, out=str(out), progress=False))
    assert not out.exists()
