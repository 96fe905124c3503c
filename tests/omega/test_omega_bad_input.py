"""Bad Omega parameters are SpecErrors with the dotted path, the value and a suggestion."""

import pytest

import atlas_core as ac
from atlas_core.errors import SpecError
from atlas_plugins.omega.poly import PolyFeatureMap
from atlas_plugins.omega.window import OmegaWindow


def issues_of(memory):
    with pytest.raises(SpecError) as info:
        ac.build_rule(memory, path="memory")
    return {i.path: i for i in info.value.issues}, str(info.value)


def window(**params):
    return {"bias": {"use": "omega:window", **params}}


def poly(**params):
    return {"feature_map": {"use": "omega:poly", **params}}


@pytest.mark.parametrize("value", [0, -3])
def test_window_below_one(value):
    issues, text = issues_of(window(window=value))
    issue = issues["memory.bias.window"]
    assert issue.value == value and "greater than or equal to 1" in issue.message
    assert "memory.bias.window" in text


def test_degree_below_one():
    issues, _ = issues_of(poly(degree=0))
    assert issues["memory.feature_map.degree"].value == 0
    assert "greater than or equal to 1" in issues["memory.feature_map.degree"].message


def test_tensor_mode_without_dim():
    issues, _ = issues_of(poly(mode="tensor"))
    assert "dim = " in issues["memory.feature_map.dim"].message  # says what to write


def test_dim_in_elementwise_mode_is_refused():
    issues, _ = issues_of(poly(dim=16))
    issue = issues["memory.feature_map.dim"]
    assert issue.value == 16 and "tensor" in issue.message


def test_unknown_inner_bias_has_a_suggestion():
    issues, text = issues_of(window(inner="core:l3"))
    issue = issues["memory.bias.inner"]
    assert issue.value == "core:l3" and "core:l2" in issue.hint
    assert "did you mean" in text


def test_inner_bias_from_a_missing_namespace_names_it():
    issues, _ = issues_of(window(inner="acme_absent:huber"))
    assert "namespace 'acme_absent'" in issues["memory.bias.inner"].hint


def test_inner_window_is_refused():
    issues, _ = issues_of(window(inner={"use": "omega:window", "window": 2}))
    assert "per-token" in issues["memory.bias.inner"].message


def test_unknown_gamma_mode():
    issues, _ = issues_of(window(gamma="unifrom"))
    issue = issues["memory.bias.gamma"]
    assert issue.value == "unifrom" and "'uniform'" in issue.message


@pytest.mark.parametrize("decay", [0.0, 1.5])
def test_decay_outside_unit_interval(decay):
    issues, _ = issues_of(window(gamma="decay", decay=decay))
    assert issues["memory.bias.decay"].value == decay


def test_decay_factor_with_another_mode_is_refused():
    issues, _ = issues_of(window(gamma="gate", decay=0.5))
    assert "gamma='decay'" in issues["memory.bias"].message


def test_misspelled_key_gets_did_you_mean():
    issues, _ = issues_of(window(windw=4))
    assert "'window'" in issues["memory.bias.windw"].hint


def test_every_problem_is_reported_at_once():
    spec = {**window(window=0), **poly(mode="tensor", degree=0)}
    issues, text = issues_of(spec)
    assert {"memory.bias.window", "memory.feature_map.degree", "memory.feature_map.dim"} <= set(issues)
    assert text.startswith("3 problems")


def test_constructors_refuse_bad_values_directly():
    with pytest.raises(ValueError, match="window=0"):
        OmegaWindow(object(), window=0)
    with pytest.raises(ValueError, match="gamma='softmax'"):
        OmegaWindow(object(), window=2, gamma="softmax")
    with pytest.raises(ValueError, match="degree=0"):
        PolyFeatureMap(degree=0)
    with pytest.raises(ValueError, match="dim"):
        PolyFeatureMap(mode="tensor")


def test_rebinding_a_map_to_another_size_is_refused():
    m = PolyFeatureMap(mode="tensor", dim=4)
    m.bind(3)
    m.bind(3)  # the same size is fine
    with pytest.raises(ValueError, match="Dk=3"):
        m.bind(5)
