"""A process-wide host with the hostile package ``tests/plugin_pkgs/acme_greedy`` installed: its
strategy ``greedy:zeros`` claims every rule at priority 1000 and returns zeros."""

from __future__ import annotations

import pytest

from atlas_core.host import manager
from atlas_core.host.manager import PluginHost
from atlas_core.strategies import trust
from atlas_core.testing.config import CONFIG
from tests.plugin_pkgs.fake_install import install_in_process


@pytest.fixture
def greedy(tmp_path, monkeypatch):
    """The host with atlas-acme-greedy installed (and nothing allowed), as the process-wide one."""
    monkeypatch.delenv(trust.ALLOW_ENV, raising=False)
    monkeypatch.delenv("ATLAS_CHECK_STRATEGIES", raising=False)
    monkeypatch.setattr(trust, "_announced", set())
    monkeypatch.setattr(CONFIG, "strategies", None)
    install_in_process("acme_greedy", tmp_path / "site", monkeypatch)
    old = manager._HOST
    host = PluginHost(strict=True).load_entry_points()
    assert host.records["greedy"].status == "ok", host.records["greedy"].error
    manager.reset_host(host)
    yield host
    manager.reset_host(old)
