"""The routed experts' load-balancing loss in training (``[model.moe] aux_loss``): it reaches the
routers and what feeds them, not the experts after the last router; it is reported beside the
cross-entropy as ``balance_loss``, and is absent with the default ``aux_loss = 0``. Its value
against transformers: tests/core/test_moe.py and tests/model_import/test_hybrids.py."""

from __future__ import annotations

import copy

import pytest
import torch

from atlas_core.train.checkpoint import load_checkpoint
from atlas_core.train.launch import train
from atlas_core.train.metrics import read_metrics
from atlas_core.train.setup import TrainOptions


def _spec(tiny_spec, aux_loss, grad_accum=1):
    spec = copy.deepcopy(tiny_spec)
    spec["model"] = {"arch": "core:lm", "vocab_size": 16, "d_model": 16, "depth": 2, "heads": 2,
                     "moe": {"experts": 4, "top_k": 2, "hidden": 8, "aux_loss": aux_loss}}
    # no clipping: a clipped step would scale every gradient by the balance term's share of the norm
    spec["train"].update(steps=1, eval_every=0, warmup_steps=0, grad_clip=0.0, batch_size=4,
                         grad_accum=grad_accum)
    return spec


def _run(tmp_path, name, spec):
    out = tmp_path / name
    train(TrainOptions(spec=spec, out=str(out), progress=False))
    (record,) = [r for r in read_metrics(out / "metrics.jsonl") if r["kind"] == "train"]
    return record, load_checkpoint(out).model_tensors()


def test_the_balance_loss_reaches_the_routers_and_what_feeds_them_only(tmp_path, tiny_spec):
    plain, w0 = _run(tmp_path, "plain", _spec(tiny_spec, 0.0))
    balanced, w1 = _run(tmp_path, "balanced", _spec(tiny_spec, 0.5))
    assert "balance_loss" not in plain
    # two routed blocks of 4 experts, top 2: the pooled loss is near k = 2 at initialisation
    assert 0.5 * 1.5 < balanced["balance_loss"] < 0.5 * 4
    assert balanced["loss"] == plain["loss"]  # the reported loss is the cross-entropy, same weights
    moved = {k for k in w0 if not torch.equal(w0[k], w1[k])}
    assert {"blocks.0.mlp.router", "blocks.1.mlp.router"} <= moved
    assert "blocks.0.memory.o_proj.weight" in moved  # it feeds the second block's router
    # what only reads the routing's result: the last block's experts, the final norm
    assert not moved & {"blocks.1.mlp.gate_up", "blocks.1.mlp.down", "norm.weight"}


def test_micro_batches_report_the_mean_of_their_balance_losses(tmp_path, tiny_spec):
    record, _ = _run(tmp_path, "acc", _spec(tiny_spec, 0.5, grad_accum=2))
    assert 0.5 * 1.5 < record["balance_loss"] < 0.5 * 4


def test_aux_loss_must_not_be_negative(tiny_spec):
    from atlas_core.errors import SpecError
    from atlas_core.spec import load_spec

    with pytest.raises(SpecError) as info:
        load_spec(_spec(tiny_spec, -0.1))
    assert [i.path for i in info.value.issues] == ["model.moe.aux_loss"]
