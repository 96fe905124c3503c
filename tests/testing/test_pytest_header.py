"""The pytest report header names each namespace's owner and every refused, failed or disabled
plugin with its reason (a squatter is never listed as the owner); `--atlas-strategies` reaches the
kit."""

import pytest

from atlas_core.testing.config import CONFIG
from tests.host.test_namespaces import _install

pytest_plugins = ["pytester"]

BROKEN = """
    raise RuntimeError("broken entry module")
"""


@pytest.fixture(autouse=True)
def _restore_config():
    before = CONFIG.strategies
    yield
    CONFIG.strategies = before


def test_header_shows_owners_and_refused_and_failed_plugins(pytester, tmp_path, monkeypatch):
    _install(tmp_path / "a", monkeypatch, dist="squatter-pkg", namespace="core", module="squat_hdr_mod")
    _install(tmp_path / "b", monkeypatch, dist="broken-pkg", namespace="brokenhdr", module="broken_hdr_mod",
             source=BROKEN)
    pytester.makepyfile("def test_ok(): pass")
    result = pytester.runpytest("-p", "no:cacheprovider")
    result.stdout.fnmatch_lines([
        "atlas plugins: core (atlas-ttm *), *titans (atlas-ttm *)*",
        "atlas plugin failed: brokenhdr (broken-pkg 0.1): RuntimeError: broken entry module",
        "atlas plugin refused: core (squatter-pkg 0.1): namespace 'core' belongs to atlas-ttm*",
    ])
    first = next(line for line in result.stdout.lines if line.startswith("atlas plugins: "))
    assert "squatter-pkg" not in first and "brokenhdr" not in first
    assert result.ret == 0


def test_atlas_strategies_option_reaches_the_kit(pytester):
    pytester.makepyfile("""
        from atlas_core.testing.config import CONFIG

        def test_options():
            assert CONFIG.chosen_strategies() == ("core:chunkwise", "acme")
    """)
    result = pytester.runpytest("-p", "no:cacheprovider", "--atlas-strategies", "core:chunkwise, acme")
    result.assert_outcomes(passed=1)
