"""Namespaces are owned, and a plugin's registrations are all or nothing.

- an entry point of another distribution named like a bundled namespace (``core``, ``titans``,
  ...) is refused with a message naming both distributions; the owner loads and works;
- a namespace claimed by two third-party distributions: both refused, everything else works;
- a hook that raises after registering some components leaves none of them behind, and a name
  of its namespace is "unknown" with the reason and a pointer to `atlas plugins doctor`.
"""

from __future__ import annotations

import json
import sys
import textwrap
import types

import pytest
from typer.testing import CliRunner

from atlas_core.errors import PluginError, SpecError
from atlas_core.host import PluginHost, hookimpl
from atlas_core.host.manager import reset_host
from atlas_core.host.registry import NAMESPACE_OWNERS

REGISTER_ONE = """
    from atlas_core import hookimpl

    @hookimpl
    def atlas_register(registry):
        registry.add("bias", "{name}", "atlas_core.components.l2:build")
"""


def _install(tmp_path, monkeypatch, *, dist, namespace, module, source=None, name="evil"):
    root = tmp_path / dist
    info = root / f"{dist.replace('-', '_')}-0.1.dist-info"  # the directory name as pip writes it
    info.mkdir(parents=True)
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {dist}\nVersion: 0.1\n")
    (info / "entry_points.txt").write_text(f"[atlas_core.plugins]\n{namespace} = {module}\n")
    (root / f"{module}.py").write_text(textwrap.dedent(source or REGISTER_ONE.format(name=name)))
    monkeypatch.syspath_prepend(str(root))
    monkeypatch.delitem(sys.modules, module, raising=False)


def test_every_bundled_entry_point_has_an_owner():
    host = PluginHost(strict=True).load_entry_points()
    bundled = {r.namespace for r in host.records.values() if r.distribution == "atlas-ttm"}
    assert bundled and bundled <= set(NAMESPACE_OWNERS)
    assert all(NAMESPACE_OWNERS[ns] == "atlas-ttm" for ns in bundled)


@pytest.mark.parametrize("namespace", ["core", "titans"])
def test_a_squatter_on_a_bundled_namespace_is_refused_and_the_owner_works(tmp_path, monkeypatch, namespace):
    _install(tmp_path, monkeypatch, dist="squatter-pkg", namespace=namespace, module=f"squat_{namespace}_mod")
    host = PluginHost(strict=False).load_entry_points()
    real = host.records[namespace]
    assert real.status == "ok" and real.distribution == "atlas-ttm" and real.components
    bad = host.records[f"{namespace} ({'squatter-pkg'})"]
    assert bad.status == "refused" and not bad.components
    assert f"namespace {namespace!r} belongs to atlas-ttm" in bad.error
    assert "squatter-pkg 0.1" in bad.error and "uninstall squatter-pkg" in bad.error
    assert f"squat_{namespace}_mod" not in sys.modules  # a refused entry point is never imported
    with pytest.raises(SpecError, match="unknown bias"):
        host.registry.get("bias", f"{namespace}:evil")
    assert host.registry.get("bias", "core:l2").provider.distribution == "atlas-ttm"
    assert namespace not in host.registry.unavailable
    assert [r.namespace for r in host.failed()] == [bad.namespace]


def test_the_core_squatter_leaves_specs_working(tmp_path, monkeypatch):
    from atlas_core.train.params import resolve_task

    _install(tmp_path, monkeypatch, dist="squatter-pkg", namespace="core", module="squat_core_mod2")
    host = PluginHost(strict=False).load_entry_points()
    assert resolve_task("mqar", registry=host.registry)["use"] == "core:mqar"
    assert "core:mqar" in host.registry.names("task")


def test_strict_mode_raises_on_a_squatter(tmp_path, monkeypatch):
    _install(tmp_path, monkeypatch, dist="squatter-pkg", namespace="core", module="squat_core_mod3")
    with pytest.raises(PluginError, match=r"namespace 'core' belongs to atlas-ttm.*squatter-pkg"):
        PluginHost(strict=True).load_entry_points()


def test_two_third_party_claims_are_both_refused(tmp_path, monkeypatch):
    _install(tmp_path, monkeypatch, dist="acme-one", namespace="acme", module="acme_one_mod", name="one")
    _install(tmp_path, monkeypatch, dist="acme-two", namespace="acme", module="acme_two_mod", name="two")
    host = PluginHost(strict=False).load_entry_points()
    one, two = host.records["acme (acme-one)"], host.records["acme (acme-two)"]
    assert one.status == two.status == "refused"
    for rec in (one, two):
        assert "acme-one 0.1 (acme_one_mod) and acme-two 0.1 (acme_two_mod)" in rec.error
        assert "uninstall all but one" in rec.error
    assert "acme" not in host.records
    for name in ("acme:one", "acme:two"):
        with pytest.raises(SpecError) as exc:
            host.registry.get("bias", name)
        text = str(exc.value)
        assert "namespace 'acme' is claimed by acme-one" in text and "atlas plugins doctor" in text
    # everything else keeps working
    assert host.records["core"].status == "ok" and host.records["titans"].status == "ok"
    assert host.registry.get("bias", "core:l2")


def test_one_distribution_found_twice_is_not_a_collision(tmp_path, monkeypatch):
    _install(tmp_path / "a", monkeypatch, dist="acme-one", namespace="acme", module="acme_dup_mod", name="one")
    _install(tmp_path / "b", monkeypatch, dist="Acme_One", namespace="acme", module="acme_dup_mod", name="one")
    host = PluginHost(strict=True).load_entry_points()
    assert host.records["acme"].status == "ok"
    assert host.registry.get("bias", "acme:one")


HALF_WAY = """
    from atlas_core import hookimpl

    @hookimpl
    def atlas_register(registry):
        registry.add("bias", "first", "atlas_core.components.l2:build")
        registry.add_preset("preset_one", {"bias": "core:l2"})
        raise RuntimeError("gave up half-way")
"""


def test_a_hook_that_raises_half_way_registers_nothing(tmp_path, monkeypatch):
    _install(tmp_path, monkeypatch, dist="half-pkg", namespace="half", module="half_mod", source=HALF_WAY)
    host = PluginHost(strict=False).load_entry_points()
    rec = host.records["half"]
    assert rec.status == "failed" and rec.components == []
    assert "RuntimeError: gave up half-way" in rec.error
    assert not [c for c in host.registry.all() if c.namespace == "half"]
    for kind, name in (("bias", "half:first"), ("rule", "half:preset_one"), ("rule", "half:other")):
        with pytest.raises(SpecError) as exc:
            host.registry.get(kind, name)
        text = str(exc.value)
        assert f"unknown {kind}" in text
        assert "namespace 'half' failed to load (RuntimeError: gave up half-way)" in text
        assert "atlas plugins doctor" in text


def test_a_short_name_that_is_unknown_mentions_plugins_that_did_not_load():
    host = PluginHost(strict=False).load_entry_points()

    def register(registry):
        registry.add("rule", "only_here", "atlas_core.components.l2:build")
        raise ValueError("broken on purpose")

    mod = types.ModuleType("short_mod")
    mod.atlas_register = hookimpl(register)
    host.add_plugin_module("shorty", mod)
    with pytest.raises(SpecError) as exc:
        host.registry.get("rule", "only_here")
    text = str(exc.value)
    assert "'shorty' failed to load (ValueError: broken on purpose)" in text
    assert "atlas plugins doctor" in text


def test_a_duplicate_inside_one_hook_rolls_back_the_whole_plugin():
    host = PluginHost(strict=False)

    def register(registry):
        registry.add("bias", "x", "atlas_core.components.l2:build")
        registry.add("bias", "x", "atlas_core.components.dot:build")

    mod = types.ModuleType("dup_mod")
    mod.atlas_register = hookimpl(register)
    rec = host.add_plugin_module("dup", mod)
    assert rec.status == "failed" and "duplicate bias 'dup:x'" in rec.error
    assert not list(host.registry.all())


def test_the_cli_shows_refused_and_failed_plugins(tmp_path, monkeypatch):
    from atlas_cli.main import make_app

    _install(tmp_path, monkeypatch, dist="squatter-pkg", namespace="core", module="squat_core_mod4")
    _install(tmp_path, monkeypatch, dist="half-pkg", namespace="half", module="half_mod2", source=HALF_WAY)
    host = PluginHost(strict=False).load_entry_points()
    reset_host(host)
    try:
        runner = CliRunner()
        res = runner.invoke(make_app(), ["--format", "json", "plugins", "list"])
        assert res.exit_code == 0, res.output
        rows = {r["namespace"]: r for r in json.loads(res.output)}
        assert rows["core (squatter-pkg)"]["status"] == "refused"
        assert "belongs to atlas-ttm" in rows["core (squatter-pkg)"]["error"]
        assert rows["core"]["status"] == "ok" and rows["core"]["n_components"] > 0
        assert rows["half"]["status"] == "failed" and rows["half"]["n_components"] == 0
        res = runner.invoke(make_app(), ["plugins", "doctor"])
        assert res.exit_code == 1
        assert "REFUSED" in res.output and "squatter-pkg" in res.output
        assert "1 plugin(s) failed to load" in res.output and "1 plugin(s) refused" in res.output
    finally:
        reset_host(None)


def test_atlas_check_on_a_refused_namespace_reports_why(tmp_path, monkeypatch):
    from atlas_core.testing import cases_for_target, check_component

    _install(tmp_path, monkeypatch, dist="acme-one", namespace="acme", module="acme_one_mod3", name="one")
    _install(tmp_path, monkeypatch, dist="acme-two", namespace="acme", module="acme_two_mod3", name="two")
    host = PluginHost(strict=False).load_entry_points()
    for target in ("acme", "acme:one"):
        (case,) = cases_for_target(target, host=host)
        res = check_component(case, on_fail="collect", host=host, checks=["check_resolves_by_name"])
        assert res[0].status == "failed"
        assert "namespace 'acme' is claimed by acme-one 0.1" in res[0].message
