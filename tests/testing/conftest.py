"""Fixtures of the conformance kit's own tests: a plugin host with extra (broken) plugins."""

import sys
import textwrap
import types

import pytest

from atlas_core.host import manager
from atlas_core.host.manager import PluginHost

pytest_plugins = ["pytester"]


@pytest.fixture
def host_with():
    """``host_with({"ns": module, ...})``: the bundled plugins plus these modules, installed as
    the process-wide host for the test (the previous host comes back afterwards)."""
    old = manager._HOST

    def make(modules: dict | None = None) -> PluginHost:
        host = PluginHost(strict=False).load_entry_points()
        for ns, module in (modules or {}).items():
            host.add_plugin_module(ns, module)
        manager.reset_host(host)
        return host

    yield make
    manager.reset_host(old)


@pytest.fixture
def fake_distribution(tmp_path, monkeypatch):
    """Put a distribution on sys.path: a dist-info with an entry point, and its module's source."""

    def make(*, dist: str, namespace: str, module: str, source: str):
        info = tmp_path / f"{dist}-0.1.dist-info"
        info.mkdir()
        (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {dist}\nVersion: 0.1\n")
        (info / "entry_points.txt").write_text(f"[atlas_core.plugins]\n{namespace} = {module}\n")
        (tmp_path / f"{module}.py").write_text(textwrap.dedent(source))
        monkeypatch.syspath_prepend(str(tmp_path))
        monkeypatch.delitem(sys.modules, module, raising=False)
        return tmp_path

    return make


def plugin_module(name: str, register) -> types.ModuleType:
    from atlas_core import hookimpl

    mod = types.ModuleType(name)
    mod.atlas_register = hookimpl(register)
    return mod
