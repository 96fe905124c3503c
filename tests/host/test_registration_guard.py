"""Registration cannot be bypassed from a hook: `commit` is refused inside it, and writes to the
registry that go around the hook's view (a private attribute, `Registry.add`) are undone and fail
the plugin, so nothing of it resolves and the core's components stay the core's."""

from __future__ import annotations

import types

import pytest

from atlas_core.errors import PluginError, SpecError
from atlas_core.host import PluginHost, hookimpl
from atlas_core.host.registry import CORE_PROVIDER, Component

from .test_namespaces import _install

COMMIT_THEN_RAISE = """
    from atlas_core import hookimpl

    @hookimpl
    def atlas_register(registry):
        registry.add("bias", "sneaky", "atlas_core.components.l2:build")
        registry.commit()
        raise RuntimeError("raised after committing")
"""


def _plugin(host, namespace, register):
    mod = types.ModuleType(f"{namespace}_mod")
    mod.atlas_register = hookimpl(register)
    return host.add_plugin_module(namespace, mod)


def _unknown(host, kind, name):
    with pytest.raises(SpecError):
        host.registry.get(kind, name)


def test_a_hook_that_commits_then_raises_leaves_no_resolvable_component(tmp_path, monkeypatch):
    _install(tmp_path, monkeypatch, dist="sneaky-pkg", namespace="sneaky", module="sneaky_mod",
             source=COMMIT_THEN_RAISE)
    host = PluginHost(strict=False).load_entry_points()
    rec = host.records["sneaky"]
    assert rec.status == "failed" and rec.components == []
    assert "called registry.commit() inside its atlas_register hook" in rec.error
    _unknown(host, "bias", "sneaky:sneaky")
    assert host.records["core"].status == "ok"


def test_a_commit_that_dodges_the_refusal_is_undone():
    host = PluginHost(strict=False).load_entry_points()

    def register(registry):
        registry.add("bias", "dodge", "atlas_core.components.l2:build")
        registry.in_hook = False  # a private flag reset by hand: the host still sees the write
        registry.commit()

    rec = _plugin(host, "dodger", register)
    assert rec.status == "failed" and rec.components == []
    assert "wrote to the registry during its atlas_register hook" in rec.error
    assert "bias dodger:dodge" in rec.error
    _unknown(host, "bias", "dodger:dodge")


def test_the_core_registry_is_not_writable_through_a_private_attribute():
    host = PluginHost(strict=False).load_entry_points()
    real_l2 = host.registry.get("bias", "core:l2")

    def register(registry):
        core = registry._registry
        core.add(Component(name="core:evil", kind="bias", factory="atlas_core.components.l2:build",
                           provider=CORE_PROVIDER))
        core._items["bias"]["core:l2"] = Component(
            name="core:l2", kind="bias", factory="atlas_core.components.dot:build", provider=CORE_PROVIDER)
        registry.add("bias", "honest", "atlas_core.components.l2:build")

    rec = _plugin(host, "evil", register)
    assert rec.status == "failed" and rec.components == []
    assert "bias core:evil" in rec.error and "bias core:l2" in rec.error
    _unknown(host, "bias", "core:evil")
    _unknown(host, "bias", "evil:honest")
    assert host.registry.get("bias", "core:l2") is real_l2


def test_strict_mode_raises_and_a_clean_plugin_still_loads():
    host = PluginHost(strict=True).load_entry_points()

    def register(registry):
        registry.add("bias", "fine", "atlas_core.components.l2:build")
        registry.commit()

    with pytest.raises(PluginError, match="inside its atlas_register hook"):
        _plugin(host, "strict_one", register)
    rec = _plugin(host, "clean", lambda registry: registry.add("bias", "ok", "atlas_core.components.l2:build"))
    assert rec.status == "ok" and rec.components == ["clean:ok"]
    assert host.registry.get("bias", "clean:ok").provider.namespace == "clean"
