"""The Titans example specs build as written (parameters per block reported) and, shrunk to tiny
sizes with the same memory and layer tables, train a few steps with finite, falling loss."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

import atlas_core as ac
from atlas_core.spec import load_spec

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"
NAMES = ["titans_lmm", "titans_deep_lmm", "titans_mag", "titans_mal", "titans_mac"]


@pytest.mark.parametrize("name", NAMES)
def test_example_builds_and_runs(name):
    path = EXAMPLES / f"{name}.toml"
    spec = load_spec(path)
    assert spec.model["arch"].startswith("titans:")
    torch.manual_seed(0)
    model = ac.build_model(path)
    report = dict(model.param_report())
    blocks = [k for k in report if k.startswith("blocks.")]
    assert len(blocks) == spec.model["depth"] and all(report[b] > 0 for b in blocks)
    ids = torch.randint(0, spec.model["vocab_size"], (1, 6))
    with torch.no_grad():
        logits = model(ids)
    assert logits.shape == (1, 6, spec.model["vocab_size"]) and torch.isfinite(logits).all()


@pytest.mark.parametrize("name", NAMES)
def test_example_trains_a_few_steps_when_shrunk(name):
    data = load_spec(EXAMPLES / f"{name}.toml").to_dict()
    small = {"vocab_size": 24, "d_model": 16, "depth": 1, "heads": 2}
    for key in ("window", "segment_size"):
        if key in data["model"]:
            small[key] = 4
    if "persistent_tokens" in data["model"]:
        small["persistent_tokens"] = 2
    data["model"].update(small)
    data["model"].pop("attn_heads", None)
    torch.manual_seed(0)
    model = ac.build_model(data)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    ids = torch.randint(0, 24, (2, 13), generator=torch.Generator().manual_seed(0))
    losses = []
    for _ in range(4):
        loss = model.loss(ids[:, :-1], ids[:, 1:])
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(loss.item())
    assert all(torch.isfinite(torch.tensor(losses))) and losses[-1] < losses[0]
