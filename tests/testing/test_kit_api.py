"""The kit's API: cases and their ids, selection by kind and capabilities, expected failures,
unknown names, and the catalogue."""

import subprocess
import sys
import warnings

import pytest

from atlas_core.testing import Case, catalogue, cases_for_target, check_component
from atlas_core.testing.runner import TargetError, resolve, select_checks

from .broken_components import register_broken
from .conftest import plugin_module

REQUIRED = {
    "check_resolves_by_name", "check_params_forbid_extra_keys", "check_params_roundtrip_toml",
    "check_shapes_and_dtypes", "check_causal", "check_strategies_match_sequential",
    "check_state_carry", "check_gradients_finite", "check_gradients_match_reference",
    "check_gradcheck_float64", "check_deterministic_seed", "check_bf16_close_to_fp32",
    "check_long_sequence_stable", "check_reductions", "check_entry_module_light",
}


def test_catalogue_has_the_design_checks_each_with_a_clause():
    cat = catalogue()
    assert REQUIRED <= set(cat)
    for check in cat.values():
        assert check.clause.endswith(".") or check.clause.endswith(")."), check.name
        assert check.anchor == f"docs/plugins.md#{check.name}"


@pytest.mark.parametrize("case, expected", [
    (Case("core:l2"), "core:l2"),
    (Case("core:chunkwise", params={"chunk_size": 4}), "core:chunkwise(chunk_size=4)"),
    (Case("omega:window", params={"window": 4, "inner": {"use": "core:l2"}}), "omega:window(inner=core:l2,window=4)"),
    (Case("core:l2", rule={"algorithm": "core:gd"}), "core:l2@{algorithm=core:gd}"),
    (Case("core:l2", id="custom"), "custom"),
])
def test_ids_come_from_names_and_params(case, expected):
    assert case.case_id == expected


def test_ids_never_hold_object_reprs():
    cid = Case("core:l2", params={"x": object(), "f": 0.5, "flag": True}).case_id
    assert cid == "core:l2(f=0.5,flag=true,x=object)" and "0x" not in cid


@pytest.mark.parametrize("kwargs, match", [
    ({"name": "l2"}, "must be a component name 'namespace:name'"),
    ({"name": "core:l2", "params": [1]}, "params must be a mapping"),
    ({"name": "core:l2", "sizes": {"batch": 2}}, r"sizes \['batch'\] are unknown"),
])
def test_bad_cases_are_value_errors(kwargs, match):
    with pytest.raises(ValueError, match=match):
        Case(**kwargs)


def test_on_fail_must_be_raise_or_collect():
    with pytest.raises(ValueError, match="on_fail='ignore' must be 'raise' or 'collect'"):
        check_component("core:l2", on_fail="ignore")


def test_checks_are_selected_by_kind_and_capabilities(host_with):
    host_with({"broken": plugin_module("broken_plugin_for_selection", register_broken)})
    names = lambda case: {c.name for c in select_checks(resolve(case))}  # noqa: E731
    bias = names(Case("core:l2"))
    assert {"check_causal", "check_gradcheck_float64", "check_strategies_match_sequential"} <= bias
    assert "check_capabilities_hold" not in bias and "check_reductions" not in bias
    assert "check_capabilities_hold" in names(Case("core:decay"))  # declares 'linear'
    assert "check_reductions" in names(Case("broken:false_claim"))  # declares a reduction
    assert "check_reductions" in names(Case("core:l2", reductions=[{"name": "x", "equals": "core:l2"}]))
    seq = names(Case("core:sequential"))
    assert "check_causal" in seq and "check_strategies_match_sequential" not in seq
    task = names(Case("core:mqar"))
    assert task == {"check_resolves_by_name", "check_params_forbid_extra_keys",
                    "check_params_roundtrip_toml", "check_entry_module_light"}
    assert names(Case("cuda:chunk_linear")) >= {"check_backend_matches_reference"}


def test_expected_failures_give_xfail_and_xpass(host_with):
    host_with({"broken": plugin_module("broken_plugin_for_xfail", register_broken)})
    res = check_component(
        Case("broken:chunkwise"), on_fail="raise",
        checks=["check_causal", "check_strategies_match_sequential"],
        expected_failures={"check_strategies_match_sequential": "kernel pending",
                           "check_causal": "not really broken"},
    )
    by = {r.name: r for r in res}
    assert by["check_strategies_match_sequential"].status == "xfail"
    assert by["check_strategies_match_sequential"].reason == "kernel pending"
    assert "max abs diff=" in by["check_strategies_match_sequential"].message
    assert by["check_causal"].status == "xpass"


def test_expected_failure_matching_no_check_warns_with_its_name():
    with pytest.warns(UserWarning, match=r"'check_bf16_close_to_fp3' matches no check: did you mean 'check_bf16_close_to_fp32'"):
        check_component("core:l2", checks=["check_resolves_by_name"],
                        expected_failures={"check_bf16_close_to_fp3": "typo"})
    with pytest.warns(UserWarning, match=r"'check_backend_matches_reference' matches no check: no case selects it"):
        check_component("core:l2", checks=["check_resolves_by_name"],
                        expected_failures={"check_backend_matches_reference": "n/a"})
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        check_component("core:l2", checks=["check_resolves_by_name"],
                        expected_failures={"check_resolves_by_name": "matches"})


@pytest.mark.parametrize("name, hint", [
    ("core:l22", "did you mean 'core:l2'"),
    ("titan:mlp", "did you mean 'titans'"),
])
def test_unknown_component_fails_resolution_with_a_hint(name, hint):
    res = check_component(Case(name), on_fail="collect")
    assert res[0].name == "check_resolves_by_name" and res[0].status == "failed"
    assert hint in res[0].message


def test_targets_of_atlas_check():
    with pytest.raises(TargetError, match="unknown namespace 'titan'; did you mean 'titans'"):
        cases_for_target("titan")
    with pytest.raises(TargetError, match="unknown component 'core:l22'; did you mean 'core:l2'"):
        cases_for_target("core:l22")
    core = {c.name for c in cases_for_target("core")}
    assert {"core:l2", "core:chunkwise", "core:sequential"} <= core
    mru = [c for c in cases_for_target("mru") if c.name == "mru:brent_kung"]
    assert mru and mru[0].rule == "mru:mru"  # a declared check case


def test_a_strategy_for_one_family_runs_on_a_preset_it_supports():
    subject = resolve(Case("atlas_muon:atlas_parallel"))
    assert subject.rule_spec()["use"].startswith("atlas_muon:")


def test_checks_leave_the_callers_thread_setting_alone():
    import torch

    before = torch.get_num_threads()
    check_component("core:l2", checks=["check_causal"])
    assert torch.get_num_threads() == before


def test_the_kit_and_its_pytest_plugin_import_without_torch():
    code = ("import sys, atlas_core.testing, atlas_core.testing.pytest_plugin, atlas_core.testing.cases; "
            "print('torch' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"


def _chunkwise_titles(subject, rule):
    return [v.title for v in subject.variants(rule)[0] if v.label.startswith("core:chunkwise")]


def test_chunked_variants_run_on_the_rule_as_given_or_on_it_rebuilt_with_an_anchor():
    import torch

    subject = resolve(Case("titans:titans_deep"))  # anchor = 16: chunk size 3 does not divide it
    rule = subject.build_rule(dtype=torch.float64)
    variants = [v for v in subject.variants(rule)[0] if v.label.startswith("core:chunkwise")]
    assert [v.title for v in variants] == [
        "core:chunkwise(chunk_size=1)", "core:chunkwise(chunk_size=3) on the rule with anchor = 6"]
    assert variants[1].reference_title == "core:sequential on the rule with anchor = 6"
    assert subject.rule_for(rule, variants[0]) is rule
    rebuilt = subject.rule_for(rule, variants[1])
    assert (rule.anchor, rebuilt.anchor) == (16, 6)
    assert subject.rule_for(rule, variants[1]) is rebuilt  # built once
    a, b = rule.state_dict(), rebuilt.state_dict()  # seeded identically: the same initial weights
    assert list(a) == list(b) and all(torch.equal(a[k], b[k]) and b[k].dtype == torch.float64 for k in a)
    # a linear memory with a prediction-free bias is accepted at chunk size 3 as given
    dot = resolve(Case("core:dot"))
    assert _chunkwise_titles(dot, dot.build_rule()) == ["core:chunkwise(chunk_size=1)", "core:chunkwise(chunk_size=3)"]
    # a per-token rule: core:exact_chunk runs it as given, core:chunkwise on anchor = 6
    titans = resolve(Case("titans:titans"))
    titles = [v.title for v in titans.variants(titans.build_rule())[0]]
    assert "core:exact_chunk(chunk_size=3)" in titles
    assert "core:chunkwise(chunk_size=3) on the rule with anchor = 6" in titles


def test_a_standalone_rule_is_not_rebuilt_with_an_anchor():
    subject = resolve(Case("mru:mru"))
    variants, left = subject.variants(subject.build_rule())
    assert all(v.anchor is None for v in variants)
    assert any("core:chunkwise(chunk_size=3)" in r and "standalone rule takes no anchor" in r for r in left)
