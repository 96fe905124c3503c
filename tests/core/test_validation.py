"""Bad input to a rule: one ValueError naming the argument and the shapes."""

import pytest
import torch

import atlas_core as ac
from atlas_core.errors import SpecError, StrategyError

from .conftest import make_inputs


@pytest.fixture
def rule():
    return ac.build_rule({"retention": "core:decay", "algorithm": "core:momentum"})


def test_wrong_rank(rule):
    q, k, v, g = make_inputs()
    with pytest.raises(ValueError, match=r"q must have 4 dimensions .*\(2, 11, 12\)"):
        rule(q.flatten(2), k, v, gates=g)


def test_mismatched_shapes(rule):
    q, k, v, g = make_inputs()
    with pytest.raises(ValueError, match=r"q and k must have the same shape"):
        rule(q, k[:, :5], v, gates=g)
    with pytest.raises(ValueError, match=r"v must be \[B, T, H, Dv\]"):
        rule(q, k, v[:, :5], gates=g)


def test_mismatched_dtype(rule):
    q, k, v, g = make_inputs()
    with pytest.raises(ValueError, match=r"v has dtype torch.float32 but q has torch.float64"):
        rule(q, k, v.float(), gates=g)


def test_missing_and_unknown_gates(rule):
    q, k, v, g = make_inputs()
    with pytest.raises(ValueError, match=r"missing gates \['eta'\]"):
        rule(q, k, v, gates={"alpha": g["alpha"], "theta": g["theta"]})
    with pytest.raises(ValueError, match=r"not used by this rule.*did you mean 'theta'"):
        rule(q, k, v, gates={**g, "thetaa": g["theta"]})
    with pytest.raises(ValueError, match=r"gates\['alpha'\] must be \[B, T, H\] = \[2, 11, 3\]"):
        rule(q, k, v, gates={**g, "alpha": g["alpha"][:, :3]})


def test_wrong_state(rule):
    q, k, v, g = make_inputs()
    with pytest.raises(ValueError, match=r"state has keys \['M'\] but this rule's state has \['M', 'Z.M'\]"):
        rule(q, k, v, gates=g, state={"M": torch.zeros(2, 3, 5, 4)})
    bad = {"M": torch.zeros(2, 3, 4, 4), "Z.M": torch.zeros(2, 3, 5, 4)}
    with pytest.raises(ValueError, match=r"state\['M'\] must have shape \(2, 3, 5, 4\), got \(2, 3, 4, 4\)"):
        rule(q, k, v, gates=g, state=bad)


def test_rebinding_to_other_sizes(rule):
    q, k, v, g = make_inputs()
    rule(q, k, v, gates=g)
    q2, k2, v2, g2 = make_inputs(H=2)
    with pytest.raises(ValueError, match=r"bound to heads=3"):
        rule(q2, k2, v2, gates=g2)


def test_unknown_knob_names_collected_with_suggestions():
    with pytest.raises(SpecError) as info:
        ac.build_rule({"bias": "core:l3", "algorithm": "core:momentun", "retension": "core:none"})
    text = str(info.value)
    assert "3 problems" in text
    assert "bias: unknown bias (got 'core:l3')" in text
    assert "'core:momentum'" in text
    assert "retension: unknown key; did you mean 'retention'?" in text


def test_missing_plugin_namespace_is_named():
    with pytest.raises(SpecError, match=r"namespace 'acme' is not installed|no installed plugin provides namespace 'acme'"):
        ac.build_rule({"bias": "acme:fancy"})


def test_bad_strategy_params():
    with pytest.raises(SpecError, match=r"parallel.chunk_size"):
        ac.build_rule({}).forward(*make_inputs()[:3], gates={"theta": make_inputs()[3]["theta"]},
                                  strategy={"use": "core:chunkwise", "chunk_size": 0})


def test_strategy_refusal_names_reason():
    from atlas_core.knobs.retention import Retention
    from atlas_core.strategies.exact_chunk import ExactChunk

    rule = ac.build_rule({})
    rule.retention = type("Softish", (Retention,), {"linear": False})()
    q, k, v, g = make_inputs()
    # a nonlinear retention has the stepped chunk form only inside anchor blocks: a per-token
    # rule at chunk size 4 is refused with the reason
    with pytest.raises(StrategyError, match=r"core:chunkwise cannot run this rule: chunk_size=4 .*per-token"):
        rule(q, k, v, gates={"theta": g["theta"]}, strategy={"use": "core:chunkwise", "chunk_size": 4})
    assert "is nonlinear" in ExactChunk().supports(rule)[1]
    # auto falls back to the reference
    y, _ = rule(q, k, v, gates={"theta": g["theta"]}, strategy="auto")
    assert y.shape == v.shape
    assert rule.runner("auto").name == "core:sequential"


def test_chunkwise_refusals_name_the_anchor():
    """core:chunkwise runs only what equals core:sequential: a per-token rule whose gradients
    depend on the memory is refused at C > 1 and by default, a chunk that does not divide the
    anchor is refused; each reason names the anchor and what to write instead."""
    q, k, v, g = make_inputs()
    gates = {"theta": g["theta"]}
    per_token = ac.build_rule({})
    with pytest.raises(StrategyError, match=r"chunk_size=4 .*per-token.*anchor = 1.*write anchor = 4"):
        per_token(q, k, v, gates=gates, strategy={"use": "core:chunkwise", "chunk_size": 4})
    with pytest.raises(StrategyError, match=r"per-token \(anchor = 1\).*core:exact_chunk.*anchor = A"):
        per_token(q, k, v, gates=gates, strategy="core:chunkwise")
    anchored = ac.build_rule({"anchor": 6})
    with pytest.raises(StrategyError, match=r"chunk_size=4 does not divide the rule's anchor=6.*e\.g\. 6"):
        anchored(q, k, v, gates=gates, strategy={"use": "core:chunkwise", "chunk_size": 4})
    # C = 1 always runs, and a divisor of the anchor runs
    for C in (1, 2, 3, 6):
        anchored(q, k, v, gates=gates, strategy={"use": "core:chunkwise", "chunk_size": C})
    per_token(q, k, v, gates=gates, strategy={"use": "core:chunkwise", "chunk_size": 1})
    # exact_chunk is the per-token rule's chunked form, and refuses the anchored one
    per_token(q, k, v, gates=gates, strategy={"use": "core:exact_chunk", "chunk_size": 4})
    with pytest.raises(StrategyError, match=r"anchored \(anchor = 6"):
        anchored(q, k, v, gates=gates, strategy="core:exact_chunk")


@pytest.mark.parametrize("bad", [0, -1, 2.5, True, "4", None, (1 << 20) + 1, 10**12])
def test_bad_anchor_is_one_spec_error_naming_anchor(bad):
    with pytest.raises(SpecError) as info:
        ac.build_rule({"bias": "core:l2", "anchor": bad})
    issues = info.value.issues
    assert len(issues) == 1 and issues[0].path == "anchor", str(info.value)
    assert issues[0].value is bad or issues[0].value == bad
    text = str(info.value)
    assert text.startswith("anchor: must be") and (bad is None or f"(got {bad!r})" in text)
    # inside a preset the same problem, with the same path
    with pytest.raises(SpecError) as info:
        ac.build_rule({"use": "titans:titans", "anchor": bad})
    assert [i.path for i in info.value.issues] == ["anchor"]


def test_bad_anchor_is_collected_with_other_problems():
    with pytest.raises(SpecError) as info:
        ac.build_rule({"bias": "core:l3", "anchor": 0})
    assert sorted(i.path for i in info.value.issues) == ["anchor", "bias"]


def test_anchor_bounds_are_accepted():
    from atlas_core.rule import MAX_ANCHOR

    assert ac.build_rule({}).anchor == 1
    assert ac.build_rule({"anchor": 1}).anchor == 1
    assert ac.build_rule({"anchor": MAX_ANCHOR}).anchor == MAX_ANCHOR


def test_standalone_rule_refuses_an_anchor():
    with pytest.raises(SpecError) as info:
        ac.build_rule({"use": "mru:mru", "anchor": 4})
    (issue,) = info.value.issues
    assert issue.path == "anchor" and "standalone" in issue.message and issue.value == 4
    rule = ac.build_rule({"use": "mru:mru", "anchor": 1})  # the per-token default is accepted
    assert getattr(rule, "anchor", 1) == 1
