"""The OmegaNet example spec loads, resolves, round-trips through TOML and builds a model; Omega
memory tables resolve with every default filled and read back equal."""

from pathlib import Path

import pytest
import torch

import atlas_core as ac
from atlas_core.errors import SpecError
from atlas_core.spec import dump_toml, load_spec, parse_toml

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "omeganet_lmm.toml"


def test_example_resolves_to_omeganet():
    spec = load_spec(EXAMPLE)
    assert spec.model["arch"] == "core:lm"  # the generic memory language model
    mem = spec.memory
    assert mem["use"] == "omega:omeganet"
    assert mem["bias"] == {"use": "omega:window", "window": 8, "inner": "core:l2",
                           "gamma": "gate", "decay": 0.9}
    assert mem["feature_map"]["use"] == "omega:poly" and mem["feature_map"]["degree"] == 2
    # Atlas' chunked training is the rule anchored at 64; chunkwise's chunk divides it, so the
    # strategy computes exactly that rule
    assert mem["anchor"] == 64
    assert mem["parallel"]["use"] == "core:chunkwise" and 64 % mem["parallel"]["chunk_size"] == 0
    again = load_spec(spec.to_toml())
    assert again.memory == mem and again.model == spec.model


@pytest.mark.parametrize("memory", [
    {"use": "omega:omega_titans", "feature_map": "omega:taylor"},
    {"bias": {"use": "omega:window", "window": 3, "gamma": "decay", "decay": 0.5},
     "feature_map": {"use": "omega:poly", "mode": "tensor", "dim": 8, "projection": "fixed"}},
], ids=["omega_titans-taylor", "window-decay-poly-tensor"])
def test_memory_tables_round_trip(memory):
    model = {"arch": "titans:lmm", "vocab_size": 32, "d_model": 16}
    text = dump_toml({"model": model, "memory": memory})
    spec = load_spec(text)
    back = load_spec(parse_toml(spec.to_toml(), "<resolved>"))
    assert back.memory == spec.memory


def test_example_builds_a_tiny_model_that_trains_the_map():
    data = parse_toml(EXAMPLE.read_text(), str(EXAMPLE))
    data["model"].update(vocab_size=32, d_model=16, depth=1, heads=2)
    data["layer"]["d_key"] = 8
    data["memory"]["parallel"] = {"use": "core:chunkwise", "chunk_size": 4}  # divides anchor = 64
    model = ac.build_model(data)
    ids = torch.randint(0, 32, (2, 11), generator=torch.Generator().manual_seed(0))
    logits = model(ids)
    assert logits.shape == (2, 11, 32) and torch.isfinite(logits).all()
    logits.logsumexp(-1).mean().backward()
    coef = dict(model.named_parameters())["blocks.0.memory.rule.feature_map.coef"]
    assert coef.grad is not None and coef.grad.abs().max() > 0
    # the strategy changes nothing: the same model under core:sequential gives the same logits
    data["memory"]["parallel"] = "core:sequential"
    seq = ac.build_model(data)
    seq.load_state_dict(model.state_dict())
    with torch.no_grad():
        torch.testing.assert_close(seq(ids), logits.detach(), atol=1e-4, rtol=1e-4)


def test_a_per_token_omeganet_refuses_chunkwise_above_one():
    data = parse_toml(EXAMPLE.read_text(), str(EXAMPLE))
    data["memory"]["anchor"] = 1
    with pytest.raises(SpecError) as info:
        load_spec(data)
    (issue,) = info.value.issues
    assert issue.path == "memory.parallel" and "anchor = 1" in issue.message
    data["memory"]["parallel"] = {"use": "core:chunkwise", "chunk_size": 48}  # does not divide 64
    data["memory"]["anchor"] = 64
    with pytest.raises(SpecError, match="chunk_size=48 does not divide the rule's anchor=64"):
        load_spec(data)
