"""Every consumer's accept / refuse decision is a function of the rule's form (`RuleForm`).

For every bundled preset and standalone rule, and knob compositions of every bundled structure,
bias, retention and algorithm (per-token and anchored), the decisions of each registered strategy,
of the CUDA backend (its rule-level part, `rule_refusal`) and of context parallelism
(`affine_reason`) are (1) equal for rules with equal forms and (2) the small predicates over form
fields written below. ``miras:lq`` at q = 2 is ``core:decay`` (identity hooks): every consumer runs
it, and what they compute equals the reference.
"""

from __future__ import annotations

import pytest
import torch

import atlas_core as ac
from atlas_core.distributed.context import affine_reason
from atlas_core.errors import SpecError
from atlas_core.forms import RuleForm
from atlas_core.host.manager import get_registry
from atlas_plugins.atlas_muon.muon import Muon
from atlas_plugins.cuda_backend.backend_chunk import rule_refusal

KNOBS = ("structure", "bias", "retention", "algorithm", "feature_map")
EXTRA = [  # parameter settings whose form differs from the component's defaults
    {"retention": {"use": "miras:lq", "q": 2.0}},
    {"bias": {"use": "miras:lp", "p": 2.0}},
    {"bias": {"use": "omega:window", "window": 3}},
    {"bias": {"use": "omega:window", "window": 3, "inner": "core:dot"}},
    {"algorithm": "core:momentum", "retention": "core:decay"},
    {"algorithm": "core:momentum", "bias": "core:dot"},
    {"structure": "titans:mlp", "algorithm": "core:momentum"},
    {"structure": "titans:mlp", "algorithm": "atlas_muon:muon"},
    {"retention": "zoo:key_decay", "bias": "core:dot"},
    {"read": "before", "retention": "core:decay"},
]


def _specs() -> list[dict]:
    reg = get_registry()
    specs = [{"use": c.name} for c in reg.all("rule")]
    for kind in KNOBS:
        specs += [{kind: c.name} for c in reg.all(kind)]
    specs += EXTRA
    out = []
    for spec in specs:
        for anchor in (1, 4):
            s = dict(spec, anchor=anchor) if anchor > 1 else dict(spec)
            try:
                ac.build_rule(s)
            except SpecError:  # e.g. a per-key retention on a deep memory, an anchored MRU
                continue
            out.append(s)
    return out


SPECS = _specs()


def _strategies():
    reg = get_registry()
    out = {c.name: reg.build("strategy", c.name) for c in reg.all("strategy")}
    out["core:chunkwise(4)"] = reg.build("strategy", {"use": "core:chunkwise", "chunk_size": 4})
    return out


def decisions(rule) -> dict[str, bool]:
    got = {name: s.supports(rule)[0] for name, s in _strategies().items()}
    got["cuda:chunk_linear"] = rule_refusal(rule.form) is None
    got["context:affine"] = affine_reason(rule) is None
    return got


# -- the table: each consumer's decision as a predicate over form fields ---------------------------
def _chunkwise(f: RuleForm, C: int | None, fast: bool = True) -> bool:
    free = f.anchor == 1 and f.prediction_free and f.memory_linear
    per_key_ok = f.retention_shape == "head" or (
        fast and f.memory_linear and f.update == "gd" and f.window == 1)
    chunk_ok = free or (f.anchor > 1 and (C is None or C == 1 or f.anchor % C == 0)) or (
        f.anchor == 1 and C == 1)
    return (f.composed and f.retention_linear and not f.per_token_transition and per_key_ok
            and f.algorithm_chunk and (f.gradient_at == "current" or free) and chunk_ok)


def expected(f: RuleForm) -> dict[str, bool]:
    is_muon = f.algorithm_type is not None and issubclass(f.algorithm_type, Muon)
    return {
        "core:sequential": True,
        "core:chunkwise": _chunkwise(f, None),
        "core:chunkwise(4)": _chunkwise(f, 4),
        "core:exact_chunk": f.composed and f.anchor == 1 and bool(
            f.chunk_forms & {"exact_chunk", "key_decay_chunk"}),
        "atlas_muon:atlas_parallel": is_muon and _chunkwise(f, None, fast=False),
        "mru:brent_kung": not f.composed,
        "mru:hillis_steele": not f.composed,
        "mru:sklansky": not f.composed,
        "cuda:chunk_linear": (f.composed and f.matrix_memory and f.update is not None
                              and f.retention_linear and not f.per_token_transition
                              and f.gradient_at == "current" and f.retention_shape == "head"
                              and f.error in ("l2", "dot")),
        "context:affine": (f.composed and f.memory_linear and f.update is not None
                           and f.retention_linear and f.error == "l2"),
    }


def _label(spec: dict) -> str:
    return ",".join(f"{k}={v}" for k, v in spec.items())


@pytest.mark.parametrize("spec", SPECS, ids=_label)
def test_every_decision_is_the_table_over_the_form(spec):
    rule = ac.build_rule(spec)
    got = decisions(rule)
    assert set(got) == set(expected(rule.form))
    assert got == expected(rule.form), {k: (got[k], v) for k, v in expected(rule.form).items() if got[k] != v}


def test_equal_forms_get_equal_decisions():
    by_form: dict[RuleForm, tuple[str, dict]] = {}
    groups = 0
    for spec in SPECS:
        rule = ac.build_rule(spec)
        got = decisions(rule)
        if rule.form in by_form:
            first, want = by_form[rule.form]
            assert got == want, (first, _label(spec))
            groups += 1
        else:
            by_form[rule.form] = (_label(spec), got)
    assert groups > 0 and len(by_form) > 20  # the enumeration has both repeats and variety


def test_the_enumeration_covers_every_preset_and_consumer_answer():
    names = {s.get("use") for s in SPECS}
    reg = get_registry()
    assert {c.name for c in reg.all("rule")} <= names
    table = [decisions(ac.build_rule(s)) for s in SPECS]
    for consumer in table[0]:  # each consumer both accepts and refuses something
        if consumer != "core:sequential":
            assert {row[consumer] for row in table} == {True, False}, consumer


# -- miras:lq at q = 2 ---------------------------------------------------------------------------
LQ2 = {"retention": {"use": "miras:lq", "q": 2.0}}


def test_lq_at_two_has_the_form_of_decay():
    lq = ac.build_rule(LQ2).form
    decay = ac.build_rule({"retention": "core:decay"}).form
    assert lq == decay and lq.retention_linear
    assert not ac.build_rule({"retention": {"use": "miras:lq", "q": 4.0}}).form.retention_linear


@pytest.mark.parametrize("anchor, strategy", [(1, {"use": "core:exact_chunk", "chunk_size": 4}),
                                              (4, {"use": "core:chunkwise", "chunk_size": 2})])
def test_lq_at_two_runs_exactly_by_every_strategy_that_accepts_it(anchor, strategy):
    rule = ac.build_rule({**LQ2, "anchor": anchor}, heads=2, d_key=4, d_value=3).double()
    g = torch.Generator().manual_seed(0)
    B, T = 2, 11
    q, k = (torch.nn.functional.normalize(torch.randn(B, T, 2, 4, generator=g, dtype=torch.float64), dim=-1)
            for _ in range(2))
    v = torch.randn(B, T, 2, 3, generator=g, dtype=torch.float64)
    gates = {"alpha": 0.7 + 0.3 * torch.rand(B, T, 2, generator=g, dtype=torch.float64),
             "theta": 0.1 + 0.4 * torch.rand(B, T, 2, generator=g, dtype=torch.float64)}
    y0, s0 = rule(q, k, v, gates=gates, strategy="core:sequential")
    y1, s1 = rule(q, k, v, gates=gates, strategy=strategy)
    torch.testing.assert_close(y1, y0, rtol=1e-10, atol=1e-10)
    for key in s0:
        torch.testing.assert_close(s1[key], s0[key], rtol=1e-10, atol=1e-10)


def test_a_replaced_knob_recomputes_the_form():
    rule = ac.build_rule({"use": "titans:titans"})
    assert rule.form.anchor == 1
    rule.anchor = 8
    assert rule.form.anchor == 8 and rule.form.anchored


def test_gates_are_read_by_role():
    f = ac.build_rule({"use": "titans:titans"}).form
    assert (f.gate("step_size"), f.gate("momentum"), f.gate("retention")) == ("theta", "eta", "alpha")
    assert ac.build_rule({}).form.gate("momentum") is None
