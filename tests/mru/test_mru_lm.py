"""``mru:mru_lm``: built from the example spec and from dicts, state carry through `step`,
`generate` carrying H equals decoding with full re-runs, and spec errors."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

import atlas_core as ac
from atlas_core.errors import SpecError
from atlas_plugins.mru.lm import MRULM

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "mru_lm.toml"


def tiny_spec(**model) -> dict:
    return {
        "name": "mru-tiny",
        "model": {"arch": "mru:mru_lm", "vocab_size": 17, "d_model": 8, "depth": 2, "heads": 2,
                  "init_scale": 0.5, **model},
        "memory": {"use": "mru:mru", "parallel": "mru:sklansky"},
    }


def test_example_spec_builds():
    spec = ac.load_spec(EXAMPLE)
    assert spec.model["arch"] == "mru:mru_lm"
    assert spec.memory["parallel"] == {"use": "mru:brent_kung"}
    model = ac.build_model(EXAMPLE)
    assert isinstance(model, MRULM)
    assert model.layers[0].mru.d_o == 4
    logits = model(torch.randint(0, 256, (1, 5)))
    assert logits.shape == (1, 5, 256) and torch.isfinite(logits).all()


def test_step_with_carried_state_equals_one_forward():
    torch.manual_seed(0)
    model = ac.build_model(tiny_spec())
    assert model.layers[0].mru.strategy.name == "mru:sklansky"  # resolved once, when built
    ids = torch.randint(0, 17, (2, 12))
    full = model(ids)
    l1, s1 = model.step(ids[:, :5])
    l2, s2 = model.step(ids[:, 5:6], s1)
    l3, _ = model.step(ids[:, 6:], s2)
    assert set(s1) == {"layers.0.H", "layers.1.H"} and s1["layers.0.H"].shape == (2, 2, 2, 2)
    torch.testing.assert_close(torch.cat([l1, l2, l3], 1), full, rtol=1e-5, atol=1e-5)


def test_generate_carries_h_and_matches_full_reruns():
    torch.manual_seed(1)
    model = ac.build_model(tiny_spec())
    prompt = torch.randint(0, 17, (2, 4))
    out = model.generate(prompt, max_new_tokens=6, greedy=True)
    assert out.shape == (2, 10) and torch.equal(out[:, :4], prompt)
    ids = prompt
    with torch.no_grad():
        for _ in range(6):  # no state: the whole sequence again at every step
            ids = torch.cat([ids, model(ids)[:, -1].argmax(-1, keepdim=True)], 1)
    assert torch.equal(out, ids)


def test_strategies_give_the_same_model_output():
    outs = []
    for parallel in ["core:sequential", "mru:brent_kung", "mru:hillis_steele"]:
        torch.manual_seed(2)
        spec = tiny_spec()
        spec["memory"]["parallel"] = parallel
        outs.append(ac.build_model(spec)(torch.arange(17).view(1, 17)))
    for o in outs[1:]:
        torch.testing.assert_close(o, outs[0], rtol=1e-5, atol=1e-5)


def test_training_step_reduces_loss():
    torch.manual_seed(3)
    model = ac.build_model(tiny_spec())
    ids = torch.randint(0, 17, (4, 16))
    opt = torch.optim.Adam(model.parameters(), lr=3e-2)
    first = None
    for _ in range(8):
        loss = model.loss(ids[:, :-1], ids[:, 1:])
        first = first if first is not None else loss.item()
        opt.zero_grad()
        loss.backward()
        opt.step()
    assert loss.item() < first - 0.1


def test_head_size_not_a_perfect_square():
    spec = tiny_spec(d_model=12, heads=2)  # 12 / 2 = 6
    with pytest.raises(SpecError, match=r"12 / 2 = 6 is not a perfect square"):
        ac.build_model(spec)


def test_composed_memory_is_refused():
    spec = tiny_spec()
    spec["memory"] = {"use": "titans:titans"}
    with pytest.raises(SpecError, match=r"memory.use.*mru:mru"):
        ac.build_model(spec)


def test_layer_options_are_refused():
    spec = tiny_spec()
    spec["layer"] = {"conv_size": 2}
    with pytest.raises(SpecError, match=r"layer.conv_size"):
        ac.build_model(spec)


def test_unknown_model_key():
    with pytest.raises(SpecError, match=r"model.dept"):
        ac.build_model(tiny_spec(dept=3))
