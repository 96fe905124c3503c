"""Every zoo preset has an example spec in a ``core:lm`` model that validates and trains a few
steps; the trained model reloads with the rule it was trained with (the
resolved spec keeps ``steps_per_token``)."""

from __future__ import annotations

import math
from pathlib import Path

import pytest
import torch

import atlas_core as ac

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"


ZOO = ("linear_attention", "retnet", "simple_gla", "gla", "deltanet", "gated_deltanet", "kda",
       "longhorn", "rwkv7", "gated_delta_product")


def test_every_preset_has_an_example():
    assert {p.stem for p in EXAMPLES.glob("zoo_*.toml")} == {f"zoo_{n}" for n in ZOO}


@pytest.mark.parametrize("name,preset", [(n, f"zoo:{n}") for n in ZOO])
def test_example_trains_a_few_steps(name, preset, tmp_path):
    path = EXAMPLES / f"zoo_{name}.toml"
    run = ac.train(path, out=tmp_path / "run", steps=3, batch_size=4, seq_len=24,
                   overrides=["train.eval_batches=1", "model.d_model=16", "train.task.num_pairs=4"])
    model = ac.load(tmp_path / "run")
    assert model.spec.memory["use"] == preset
    layer = model.blocks[0].memory
    if name == "gated_delta_product":
        assert model.spec.memory["steps_per_token"] == 2 and layer.rule.steps_per_token == 2
        assert layer.k_proj.out_features == 2 * 16
    ids = torch.randint(0, 64, (1, 12))
    with torch.no_grad():
        logits = model(ids)
    assert torch.isfinite(logits).all()
    assert math.isfinite(run.metrics["eval_loss"])
