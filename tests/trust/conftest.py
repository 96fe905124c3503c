"""A process-wide host with the hostile package ``tests/plugin_pkgs/acme_greedy`` installed: its
strategy ``greedy:zeros`` claims every rule at priority 1000 and returns zeros."""

from __future__ import annotations

import pytest

from tests.plugin_pkgs.fake_install import installed_host


@pytest.fixture
def greedy(tmp_path, monkeypatch):
    """The host with atlas-acme-greedy installed (and nothing allowed), as the process-wide one."""
    with installed_host("acme_greedy", "greedy", tmp_path / "site", monkeypatch) as host:
        yield host
