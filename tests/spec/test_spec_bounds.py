"""Size bounds (atlas_core.spec.bounds): the limits, the checks of every value, the parameter
count used by the preflight (equal to the built model's), and the messages."""

from __future__ import annotations

import copy

import pytest
import torch

from atlas_core.errors import SpecError
from atlas_core.lm import LMParams
from atlas_core.model import build_model
from atlas_core.spec import load_spec
from atlas_core.preflight import check_model_size, estimate_params
from atlas_core.spec.bounds import LIMITS, MAX_PARAMS, lm_estimate, spec_value_issues

LM = {
    "model": {"arch": "core:lm", "vocab_size": 32, "d_model": 16, "depth": 5, "heads": 2},
    "memory": {"use": "titans:titans"},
}


def _meta_count(data) -> int:
    with torch.device("meta"):
        model = build_model(data)
    return sum(p.numel() for p in model.parameters())


@pytest.mark.parametrize("case", ["all", "some", "mac", "mru", "deep_memory", "untied", "hybrid", "hybrid_moe",
                                  "moe"])
def test_the_estimate_is_the_count_of_the_built_model(case):
    data = copy.deepcopy(LM)
    attention = {"heads": 4, "kv_heads": 2, "output_gate": "sigmoid", "qk_norm": "head"}
    moe = {"experts": 3, "top_k": 2, "hidden": 8, "shared_hidden": 4}
    if case == "hybrid":  # blocks of three kinds, the pattern repeated
        data["model"].update(depth=6, layers=["memory", "attention", "mlp"], attention=attention)
    elif case == "hybrid_moe":
        data["model"].update(depth=6, layers=["attention", "memory", "memory"], attention=attention,
                             moe={**moe, "blocks": [2, 3, 6]})
    elif case == "moe":
        data["model"].update(moe=moe)
    elif case == "some":
        data["model"]["memory_layers"] = [1, 3]
    elif case == "mac":
        data["model"].update(arch="titans:mac", depth=4)
    elif case == "mru":
        data = {"model": {"arch": "mru:mru_lm", "vocab_size": 32, "d_model": 16, "depth": 3,
                          "heads": 1}, "memory": {"use": "mru:mru"}}
    elif case == "deep_memory":
        data["memory"] = {"use": "titans:titans_deep", "structure": {"use": "titans:mlp", "depth": 3}}
    elif case == "untied":
        data["model"]["tie_embeddings"] = False
    spec = load_spec(data)
    assert estimate_params(spec) == _meta_count(data)


@pytest.mark.parametrize("key, kind", [("depth", "depth"), ("d_model", "width"), ("heads", "heads"),
                                       ("vocab_size", "vocab")])
def test_model_sizes_stop_at_their_limit(key, kind):
    base = {"vocab_size": 32, "d_model": 16, "depth": 2, "heads": 2}
    LMParams.model_validate({**base, key: LIMITS[kind]})
    with pytest.raises(Exception, match=f"less than or equal to {LIMITS[kind]}"):
        LMParams.model_validate({**base, key: LIMITS[kind] + 1})


def test_every_value_is_checked():
    section = {"a": [1, float("nan")], "b": {"c": float("-inf")}, "d": 2**60, "e": 2**53, "f": True}
    issues = spec_value_issues(section, "train")
    assert [(i.path, i.message.split(":")[0]) for i in issues] == [
        ("train.a[1]", "must be a finite number"), ("train.b.c", "must be a finite number"),
        ("train.d", "is too large")]


def test_non_finite_values_in_a_task_table_are_refused():
    data = copy.deepcopy(LM)
    data["train"] = {"task": {"use": "mqar", "power_a": float("nan")}}
    with pytest.raises(SpecError, match="train.task.power_a: .*finite"):
        load_spec(data)


def test_the_message_gives_the_count_the_sizes_would_have():
    data = copy.deepcopy(LM)
    data["model"].update(vocab_size=256, d_model=128, depth=10**9)
    with pytest.raises(SpecError) as info:
        load_spec(data)
    (issue,) = info.value.issues
    # 10**9 blocks of 128**2 * (4 + 2 * 4) parameters, plus the 256 x 128 embedding: ~2.0e14
    assert issue.path == "model.depth"
    assert issue.message == "is above the limit 1024; the model would have ~2e14 parameters (limit 1e10)"


def test_sizes_within_their_limits_can_still_make_too_big_a_model():
    data = copy.deepcopy(LM)
    data["model"].update(vocab_size=2**24, d_model=2**12, depth=2)  # 6.9e10 embedding weights
    with pytest.raises(SpecError, match=r"model.vocab_size: the model would have ~6.9e10 "
                                        r"parameters \(limit 1e10"):
        load_spec(data)
    assert lm_estimate(data["model"])[0] > MAX_PARAMS


def test_the_preflight_limit_can_be_lowered():
    spec = load_spec(LM)
    n = check_model_size(spec)
    assert n == _meta_count(LM)
    with pytest.raises(SpecError, match=r"model.d_model: the model would have ~.* parameters \(limit"):
        check_model_size(spec, limit_params=n - 1)


def test_an_absurd_value_never_reaches_a_float_overflow():
    data = copy.deepcopy(LM)
    data["model"].update(depth=10**400)
    with pytest.raises(SpecError, match="model.depth"):
        load_spec(data)
    assert lm_estimate({"d_model": 10**400}) is None  # too large for a float: no estimate


def test_head_sizes_of_the_layer_count_in_the_estimate():
    """4,096 heads of 65,536-wide keys and values on a 65,536-wide model: each projection is
    65,536 x 4,096 x 65,536 (1.8e13), four of them per block, two blocks: ~1.4e14."""
    data = {"model": {"arch": "core:lm", "vocab_size": 32, "d_model": 65536, "depth": 2,
                      "heads": 4096}, "memory": {"use": "titans:titans"}, "layer": {"d_key": 65536}}
    with pytest.raises(SpecError, match=r"layer.d_key: the model would have ~1.4e14 parameters"):
        load_spec(data)
