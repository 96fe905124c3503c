"""Every consumer's accept / refuse decision is the chunk-form catalogue's (`forms.catalogue`).

For every bundled preset and standalone rule, and knob compositions of every bundled structure,
bias, retention and algorithm (per-token and anchored), the decisions of each registered strategy,
of the CUDA backend (its rule-level part, `rule_refusal`) and of context parallelism
(`affine_reason`, `analytic_form`) are (1) equal for rules with equal forms and (2) the
catalogue's answer for the rule's form, with only each consumer's own non-form condition added
(atlas_parallel's algorithm class, the MRU strategies' rule type). ``miras:lq`` at q = 2 is
``core:decay`` (identity hooks): every consumer runs it, and what they compute equals the
reference.
"""

from __future__ import annotations

import pytest
import torch

import atlas_core as ac
from atlas_core.distributed.context import affine_reason
from atlas_core.distributed.state_map import analytic_form
from atlas_core.errors import SpecError
from atlas_core.forms import RuleForm, catalogue
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


def decisions(rule) -> dict[str, tuple[bool, str]]:
    """Every consumer's answer for ``rule``: (accepts, reason)."""
    got = {name: tuple(s.supports(rule)) for name, s in _strategies().items()}
    for name, why in (("cuda:chunk_linear", rule_refusal(rule.form)),
                      ("context:affine", affine_reason(rule))):
        got[name] = (why is None, why or "")
    got["context:slice_map"] = (analytic_form(rule) is not None, str(analytic_form(rule)))
    return got


# -- the catalogue's answers, with each consumer's own non-form condition -------------------------
def _answer(why: str | None) -> tuple[bool, str]:
    return why is None, why or ""


def _composed(f: RuleForm, strategy: str, why: str | None) -> tuple[bool, str]:
    if not f.composed:  # the strategy's own message for a standalone rule
        return False, f"{strategy} runs knob-composed rules; this rule is standalone"
    return _answer(why)


def catalogue_answers(rule) -> dict[str, tuple[bool, str]]:
    f = rule.form
    muon = f.algorithm_type is not None and issubclass(f.algorithm_type, Muon)
    chunkwise = _composed(f, "core:chunkwise", catalogue.chunkwise_reason(f, None))
    kind = catalogue.slice_map_form(f)
    return {
        "core:sequential": (True, ""),
        "core:chunkwise": chunkwise,
        "core:chunkwise(4)": _composed(f, "core:chunkwise", catalogue.chunkwise_reason(f, 4)),
        "core:exact_chunk": _composed(f, "core:exact_chunk", catalogue.exact_reason(f)),
        # its own condition: the Muon algorithm class (docs/architecture.md)
        "atlas_muon:atlas_parallel": chunkwise if muon else (False, None),
        # the MRU strategies decide by the rule's type: the standalone MRU only
        "mru:brent_kung": (not f.composed, None),
        "mru:hillis_steele": (not f.composed, None),
        "mru:sklansky": (not f.composed, None),
        "cuda:chunk_linear": _answer(catalogue.linear_kernel_reason(f)),
        "context:affine": _answer(catalogue.affine_reason(f)),
        "context:slice_map": (kind is not None, str(kind)),
    }


def _label(spec: dict) -> str:
    return ",".join(f"{k}={v}" for k, v in spec.items())


def _differences(got: dict, want: dict) -> dict:
    """Consumers whose decision, or (where the catalogue words it) reason, differs."""
    return {k: (got[k], w) for k, w in want.items()
            if got[k][0] != w[0] or (w[1] is not None and got[k][1] != w[1])}


@pytest.mark.parametrize("spec", SPECS, ids=_label)
def test_every_decision_is_the_catalogues(spec):
    rule = ac.build_rule(spec)
    got, want = decisions(rule), catalogue_answers(rule)
    assert set(got) == set(want), "a consumer without a catalogue answer here"
    assert not _differences(got, want)


@pytest.mark.parametrize("spec", SPECS, ids=_label)
def test_chunk_forms_are_the_forms_whose_requirement_holds(spec):
    f = ac.build_rule(spec).form
    assert f.chunk_forms == {c.name for c in catalogue.CATALOGUE if c.requires(f) is None}
    for c in catalogue.CATALOGUE:  # a refusal always says why
        why = c.requires(f)
        assert why is None or (isinstance(why, str) and len(why) > 20), (c.name, why)


def test_every_form_both_holds_and_fails_somewhere():
    forms = [ac.build_rule(s).form for s in SPECS]
    for c in catalogue.CATALOGUE:
        assert {c.requires(f) is None for f in forms} == {True, False}, c.name


def test_equal_forms_get_equal_decisions():
    by_form: dict[RuleForm, tuple[str, dict]] = {}
    groups = 0
    for spec in SPECS:
        rule = ac.build_rule(spec)
        got = {k: ok for k, (ok, _) in decisions(rule).items()}
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
            assert {row[consumer][0] for row in table} == {True, False}, consumer
    kinds = {row["context:slice_map"][1] for row in table}
    assert kinds == {"exact", "key", "anchored", "None"}


def test_the_nonlinear_retentions_have_the_stepped_form_only():
    for spec in ({"use": "miras:moneta"}, {"use": "miras:memora"},
                 {"retention": {"use": "miras:lq", "q": 4.0}, "anchor": 4}):
        f = ac.build_rule(spec).form
        assert f.chunk_forms == {"stepped_chunk"}, spec
    why = catalogue.reason("stepped_chunk", ac.build_rule({"retention": "core:decay"}).form)
    assert "is linear" in why
    rwkv = ac.build_rule({"use": "zoo:rwkv7"}).form
    assert not rwkv.chunk_forms and "per-token matrix" in catalogue.reason("stepped_chunk", rwkv)


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
