"""The plugin host: isolated loading, strict mode, hook-name checks, duplicates, provenance."""

import sys
import textwrap
import types

import pytest

from atlas_core.errors import PluginError, SpecError
from atlas_core.host import PluginHost, hookimpl


def _module(name, register=None, **attrs):
    mod = types.ModuleType(name)
    if register is not None:
        mod.atlas_register = hookimpl(register)
    for k, v in attrs.items():
        setattr(mod, k, v)
    return mod


def _fake_distribution(tmp_path, monkeypatch, *, dist, namespace, module, source):
    """Install a distribution on sys.path: dist-info with an entry point, and its module."""
    info = tmp_path / f"{dist}-0.1.dist-info"
    info.mkdir()
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {dist}\nVersion: 0.1\n")
    (info / "entry_points.txt").write_text(f"[atlas_core.plugins]\n{namespace} = {module}\n")
    (tmp_path / f"{module}.py").write_text(textwrap.dedent(source))
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.delitem(sys.modules, module, raising=False)


def test_bundled_plugins_load_in_order_with_provenance():
    host = PluginHost(strict=True).load_entry_points()
    names = list(host.records)
    assert names[0] == "core" and names[1:] == sorted(names[1:])
    comp = host.registry.get("bias", "core:l2")
    assert comp.provider.namespace == "core"
    assert comp.provider.distribution == "atlas-ttm"
    assert "core:l2" in host.records["core"].components


def test_plugin_that_raises_at_import_is_recorded_not_fatal(tmp_path, monkeypatch):
    _fake_distribution(tmp_path, monkeypatch, dist="broken-plugin", namespace="broken",
                       module="broken_plugin_mod", source="raise RuntimeError('boom at import')\n")
    host = PluginHost(strict=False).load_entry_points()
    rec = host.records["broken"]
    assert rec.status == "failed"
    assert rec.distribution == "broken-plugin" and rec.version == "0.1"
    assert "RuntimeError: boom at import" in rec.error
    assert host.records["core"].status == "ok"  # everything else still loads
    assert host.registry.get("bias", "core:l2")


def test_strict_mode_reraises(tmp_path, monkeypatch):
    _fake_distribution(tmp_path, monkeypatch, dist="broken-plugin", namespace="broken",
                       module="broken_plugin_mod2", source="raise RuntimeError('boom')\n")
    monkeypatch.setenv("ATLAS_STRICT_PLUGINS", "1")
    with pytest.raises(PluginError, match=r"plugin 'broken' \(broken-plugin 0.1, broken_plugin_mod2\) failed to load: RuntimeError: boom"):
        PluginHost().load_entry_points()


def test_misspelled_hook_is_reported_with_suggestion():
    host = PluginHost(strict=False)
    mod = _module("typo_mod", atlas_registr=hookimpl(lambda registry: None))
    rec = host.add_plugin_module("typo", mod)
    assert rec.status == "failed"
    assert "unknown hook 'atlas_registr'; did you mean 'atlas_register'?" in rec.error


def test_one_namespace_claimed_twice_names_both():
    host = PluginHost(strict=False)

    def reg(registry):
        registry.add("bias", "twice", "atlas_core.components.l2:build")

    host.add_plugin_module("acme", _module("acme_a", reg))
    rec = host.add_plugin_module("acme", _module("acme_b", reg))
    assert rec.status == "failed"
    assert "namespace 'acme' is claimed by <local> (acme_a) and by <local> (acme_b)" in rec.error
    assert host.registry.get("bias", "acme:twice").provider.module == "acme_a"


def test_duplicate_component_refused_naming_both_distributions():
    from atlas_core.host.registry import NamespacedRegistry, Provider, Registry

    reg = Registry()
    NamespacedRegistry(reg, Provider("acme", "acme-one", "1", "m1")).add("bias", "x", "m:f")
    with pytest.raises(PluginError, match=r"duplicate bias 'acme:x': provided by acme-one \(m1\) and by acme-two \(m2\)"):
        NamespacedRegistry(reg, Provider("acme", "acme-two", "1", "m2")).add("bias", "x", "m:f")


def test_plugin_may_only_register_its_namespace():
    host = PluginHost(strict=False)

    def reg(registry):
        registry.add("bias", "core:l2", "atlas_core.components.l2:build")

    rec = host.add_plugin_module("acme", _module("acme_c", reg))
    assert rec.status == "failed"
    assert "may only register names in its own namespace" in rec.error


def test_short_names_resolve_only_when_unambiguous():
    host = PluginHost(strict=True)

    def reg_a(registry):
        registry.add("bias", "shared", "atlas_core.components.l2:build")
        registry.add("bias", "only_a", "atlas_core.components.l2:build")

    def reg_b(registry):
        registry.add("bias", "shared", "atlas_core.components.dot:build")

    host.add_plugin_module("aaa", _module("mod_a", reg_a))
    host.add_plugin_module("bbb", _module("mod_b", reg_b))
    assert host.registry.get("bias", "only_a").name == "aaa:only_a"
    with pytest.raises(SpecError, match=r"ambiguous bias name.*'aaa:shared' or 'bbb:shared'"):
        host.registry.get("bias", "shared")


def test_disabled_plugins_env(monkeypatch):
    monkeypatch.setenv("ATLAS_DISABLE_PLUGINS", "titans")
    host = PluginHost(strict=True).load_entry_points()
    assert host.records["titans"].status == "disabled"
    assert not [c for c in host.registry.all() if c.namespace == "titans"]
