"""``[train] precision = "bf16"`` and ``compile = true``: validation, the memory staying float32
under autocast, and short runs that end near the fp32 run.

The full-size comparison (the default spec, 50 steps, torch.compile with its C++ backend) is
``scripts/regen_doc_figures.py precision``; docs/training.md states its numbers. Here the default
spec is shrunk so that each run takes a second, and torch.compile traces the model with the
``eager`` backend (the same graph capture, no C++ build).
"""

from __future__ import annotations

import copy
import re
import tomllib

import pytest
import torch

from atlas_core.errors import SpecError
from atlas_core.train import trainer as trainer_mod
from atlas_core.train.metrics import read_metrics
from atlas_core.train.params import train_params
from atlas_core.train.setup import TrainOptions, default_spec_text, make_plan
from atlas_core.train.errors import CompileFailed
from atlas_core.train.launch import train

# docs/training.md ("Precision and compilation") states this bound: after 50 steps the bf16 run's
# final eval loss is within 2 % of the fp32 run's.
BF16_LOSS_BOUND = 0.02


def _small_default(steps: int = 50) -> dict:
    """The embedded default spec (atlas_core/data/default_mqar.toml), shrunk to train in ~1 s."""
    data = tomllib.loads(default_spec_text())
    data["model"].update(vocab_size=32, d_model=16, depth=1, heads=2)
    data["train"].update(task={"use": "mqar", "num_pairs": 2, "seq_len": 16}, steps=steps,
                         batch_size=8, warmup_steps=5, eval_every=0, eval_batches=2, log_every=10,
                         device="cpu")
    data["memory"]["anchor"] = 8
    data["memory"]["parallel"] = {"use": "core:chunkwise", "chunk_size": 8}
    return data


def _run(tmp_path, name, **train_fields):
    data = _small_default()
    data["train"].update(train_fields)
    out = tmp_path / name
    result = train(TrainOptions(spec=data, out=str(out), progress=False))
    return result, read_metrics(out / "metrics.jsonl")


# -- validation ---------------------------------------------------------------------------------
@pytest.mark.parametrize("field,value,words", [
    ("precision", "fp16", ["train.precision", "'fp32' or 'bf16'", "fp16"]),
    ("precision", "BF16", ["train.precision", "'fp32' or 'bf16'"]),
    ("compile", "yes", ["train.compile", "boolean"]),
    ("compile", 1, ["train.compile", "boolean"]),
])
def test_bad_values_name_the_field_and_the_choices(field, value, words):
    with pytest.raises(SpecError) as info:
        train_params({field: value})
    text = str(info.value)
    assert all(w in text for w in words), text


def test_defaults_are_fp32_without_compile():
    p = train_params({})
    assert (p.precision, p.compile) == ("fp32", False)


def test_compile_without_a_cpp_compiler_is_one_clear_error(monkeypatch, tmp_path):
    import shutil

    monkeypatch.setattr(shutil, "which", lambda name, *a, **k: None)
    monkeypatch.delenv("CXX", raising=False)
    data = _small_default()
    data["train"]["compile"] = True
    with pytest.raises(SpecError) as info:
        make_plan(TrainOptions(spec=data, out=str(tmp_path / "r")))
    text = str(info.value)
    assert "train.compile" in text and "C++ compiler" in text and "compile = false" in text
    assert not (tmp_path / "r").exists()  # nothing written
    data["train"]["compile"] = False  # the same spec without compile plans fine
    make_plan(TrainOptions(spec=data, out=str(tmp_path / "r")))


# -- the memory stays float32 under autocast -----------------------------------------------------
def test_a_rule_under_bf16_autocast_computes_in_float32():
    """Under CPU bf16 autocast a rule call equals the plain float32 call exactly: autocast is off
    inside the rule, so its matmuls (inner loop, readout) are not rounded to bf16."""
    from atlas_core.rule import build_rule

    rule = build_rule({"structure": "core:linear", "bias": "core:l2", "retention": "core:none",
                       "algorithm": "core:gd", "feature_map": "core:identity", "read": "after"})
    g = torch.Generator().manual_seed(0)
    B, T, H, D = 2, 12, 2, 8
    q, k, v = (torch.randn(B, T, H, D, generator=g) for _ in range(3))
    gates = {n: torch.rand(B, T, H, generator=g) for n in rule.gate_names}
    y32, s32 = rule(q, k, v, gates=gates)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        y16, s16 = rule(q, k, v, gates=gates)
        # the check has teeth: outside the rule, the same product is rounded by autocast
        assert (q @ k.transpose(-1, -2)).dtype == torch.bfloat16
    assert y16.dtype == torch.float32 and torch.equal(y16, y32)
    assert set(s16) == set(s32)
    assert all(s16[n].dtype == torch.float32 and torch.equal(s16[n], s32[n]) for n in s32)


def test_bf16_weights_and_optimizer_state_stay_float32(tmp_path):
    from atlas_core.train.checkpoint import load_checkpoint

    _run(tmp_path, "bf16", precision="bf16", steps=3)
    ckpt = load_checkpoint(tmp_path / "bf16")
    weights = ckpt.model_tensors()
    assert weights and all(t.dtype == torch.float32 for t in weights.values())
    tensors, _ = ckpt.optimizer_state()
    assert tensors and all(t.dtype == torch.float32 for t in tensors.values()
                           if t.is_floating_point() and t.dim() > 0)


# -- 50-step runs end near fp32 ------------------------------------------------------------------
def test_bf16_run_ends_within_the_documented_bound_of_fp32(tmp_path):
    fp32, _ = _run(tmp_path, "fp32")
    bf16, _ = _run(tmp_path, "bf16", precision="bf16")
    assert fp32["steps"] == bf16["steps"] == 50
    gap = abs(bf16["eval_loss"] - fp32["eval_loss"]) / fp32["eval_loss"]
    assert gap <= BF16_LOSS_BOUND, (fp32["eval_loss"], bf16["eval_loss"])
    # and bf16 really ran: the training losses are not bitwise the fp32 ones
    # (compared on the records of the two runs' metrics logs)
    l32 = [r["loss"] for r in read_metrics(tmp_path / "fp32" / "metrics.jsonl") if r["kind"] == "train"]
    l16 = [r["loss"] for r in read_metrics(tmp_path / "bf16" / "metrics.jsonl") if r["kind"] == "train"]
    assert len(l32) == len(l16) == 5 and l32 != l16


def test_compiled_run_traces_the_model_and_matches_fp32(tmp_path, monkeypatch, capfd):
    """torch.compile (graph capture by dynamo, run by the eager backend) trains the same model:
    the losses equal the uncompiled run's, and the first step's cost is reported."""
    import torch._dynamo

    monkeypatch.setattr(trainer_mod, "COMPILE_BACKEND", "eager")
    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", str(tmp_path / "cache"))
    torch._dynamo.reset()
    try:
        plain, plain_log = _run(tmp_path, "plain")
        compiled, log = _run(tmp_path, "compiled", compile=True)
        frames = torch._dynamo.utils.counters["stats"]["unique_graphs"]
    finally:
        torch._dynamo.reset()
    assert frames > 0  # dynamo captured graphs: the compiled path was taken
    losses = lambda recs: [r["loss"] for r in recs if r["kind"] == "train"]  # noqa: E731
    assert losses(log) == pytest.approx(losses(plain_log), rel=1e-5, abs=1e-6)
    assert compiled["eval_loss"] == pytest.approx(plain["eval_loss"], rel=1e-5)
    first = [r for r in log if r.get("event") == "first_step"]
    assert len(first) == 1 and first[0]["compiled"] is True and first[0]["seconds"] > 0
    err = capfd.readouterr().err
    assert "compile: the first step took" in err and str(tmp_path / "cache") in err
    starts = [line for line in err.splitlines() if line.startswith("train: run")]
    assert [", torch.compile," in line for line in starts] == [False, True], starts
    # torch's own warnings (a graph break is many lines) are summarised in the compile line
    assert not [line for line in err.splitlines() if "torch/_dynamo" in line], err
    assert re.search(r"compiling the model, (no graph break|\d+ graph breaks? \(first: )", err), err


def test_a_failing_compilation_is_one_error_naming_the_setting(tmp_path, monkeypatch):
    import torch._dynamo

    def broken_backend(gm, example_inputs):
        raise RuntimeError("no code generator here")

    monkeypatch.setattr(trainer_mod, "COMPILE_BACKEND", broken_backend)
    torch._dynamo.reset()
    try:
        with pytest.raises(CompileFailed) as info:
            _run(tmp_path, "broken", compile=True, steps=2)
    finally:
        torch._dynamo.reset()
    text = str(info.value)
    assert text.startswith("train.compile: torch.compile failed") and "compile = false" in text
    assert "no code generator here" in text
