"""What a bad name or key tells the user: nested "did you mean", and why a namespace is missing."""

from __future__ import annotations

import types

import pytest
from pydantic import Field

from atlas_core.errors import SpecError
from atlas_core.host import PluginHost, hookimpl
from atlas_core.host.registry import NamespacedRegistry, Params, Provider, validation_issues
from atlas_core.spec import load_spec, resolve
from tests.spec.toys import VALID, toy_registry


class Inner(Params):
    alpha: float = 1.0
    theta: float = Field(2.0, gt=0)


class Outer(Params):
    width: int = 3
    inner: Inner = Inner()
    maybe: Inner | None = None


def _registry():
    reg = toy_registry()
    view = NamespacedRegistry(reg, Provider("nest", "nest-dist", "0", __name__))
    view.add("bias", "nested", "atlas_core.components.l2:build", params=Outer)
    return reg


def test_one_implementation_for_components_and_spec_tables():
    assert resolve.validation_issues is validation_issues


@pytest.mark.parametrize("field", ["inner", "maybe"])
def test_typo_in_a_nested_table_suggests_from_that_table(field):
    reg = _registry()
    with pytest.raises(SpecError) as info:
        reg.build("bias", {"use": "nest:nested", "widht": 2, field: {"alfa": 1.0, "theta": -1}},
                  path="memory.bias")
    found = {i.path: i for i in info.value.issues}
    assert set(found) == {"memory.bias.widht", f"memory.bias.{field}.alfa", f"memory.bias.{field}.theta"}
    assert found["memory.bias.widht"].hint == "did you mean 'width'?"
    assert found[f"memory.bias.{field}.alfa"].hint == "did you mean 'alpha'?"  # not a top-level key
    theta = found[f"memory.bias.{field}.theta"]
    assert theta.value == -1 and "greater than 0" in theta.message
    assert not theta.message.startswith("Value error")


def test_nested_typo_through_a_whole_spec():
    reg = _registry()
    data = {**VALID, "memory": {**VALID["memory"], "bias": {"use": "nest:nested", "inner": {"thetta": 1}}}}
    with pytest.raises(SpecError) as info:
        load_spec(data, registry=reg)
    (issue,) = info.value.issues
    assert issue.path == "memory.bias.inner.thetta" and issue.hint == "did you mean 'theta'?"


def _module(register):
    mod = types.ModuleType("hint_mod")
    mod.atlas_register = hookimpl(register)
    return mod


def test_a_disabled_namespace_says_disabled_not_missing(monkeypatch):
    monkeypatch.setenv("ATLAS_DISABLE_PLUGINS", "titans")
    host = PluginHost(strict=False).load_entry_points()
    with pytest.raises(SpecError) as info:
        host.registry.get("structure", "titans:mlp", "memory.structure")
    hint = info.value.issues[0].hint
    assert "disabled by ATLAS_DISABLE_PLUGINS" in hint and "not installed" not in hint
    data = {**VALID, "model": {"arch": "titans:lmm", "vocab_size": 16, "d_model": 8}}
    with pytest.raises(SpecError) as info:
        load_spec(data, registry=host.registry)
    found = {i.path: i for i in info.value.issues}
    assert "disabled by ATLAS_DISABLE_PLUGINS" in found["model.arch"].hint


def test_a_failed_namespace_says_it_failed():
    host = PluginHost(strict=False)

    def boom(registry):
        raise RuntimeError("boom in register")

    host.add_plugin_module("acme", _module(boom))
    with pytest.raises(SpecError) as info:
        host.registry.get("bias", "acme:fancy")
    hint = info.value.issues[0].hint
    assert "failed to load (RuntimeError: boom in register)" in hint and "plugins doctor" in hint


def test_a_namespace_never_seen_is_still_not_installed():
    host = PluginHost(strict=False)
    with pytest.raises(SpecError, match="namespace 'miras' is not installed; it is provided by atlas-miras"):
        host.registry.get("bias", "miras:yaad")


def test_nested_component_problems_are_reported_with_the_outer_params():
    """omega:window declares nested={"inner": "bias"}: a bad window AND a bad inner bias are both
    reported, although the window's factory (which builds the inner bias) cannot run."""
    from atlas_core.host.manager import get_registry

    reg = get_registry()
    with pytest.raises(SpecError) as info:
        reg.build("bias", {"use": "omega:window", "window": 0, "inner": "core:l3"}, path="memory.bias")
    found = {i.path: i for i in info.value.issues}
    assert set(found) == {"memory.bias.window", "memory.bias.inner"}
    assert found["memory.bias.window"].value == 0
    assert found["memory.bias.inner"].value == "core:l3" and "'core:l2'" in found["memory.bias.inner"].hint
    # a nested value that already failed the params model is not reported twice
    with pytest.raises(SpecError) as info:
        reg.build("bias", {"use": "omega:window", "window": 0, "inner": 3}, path="b")
    found = {i.path: i for i in info.value.issues}
    assert [i.path for i in info.value.issues] == ["b.window", "b.inner"]  # no union-member tags
    assert "valid string" in found["b.inner"].message and "valid dictionary" in found["b.inner"].message
    assert found["b.inner"].value == 3
