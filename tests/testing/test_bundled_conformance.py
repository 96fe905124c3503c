"""Every bundled plugin passes the conformance kit.

The core, titans, omega, cuda and zoo namespaces are checked here, with the cases each component
declares (``check_cases``) or its default params; atlas_muon and mru run the same kit in their
own test folders (tests/atlas_muon/test_conformance.py, tests/mru/test_mru_conformance.py). A
meta-test makes sure no bundled namespace is left out.
"""

from __future__ import annotations

import re
from pathlib import Path

from atlas_core.host.manager import get_host
from atlas_core.testing import cases_for_target, parametrize_with_checks

HERE = ("core", "titans", "omega", "cuda", "zoo")
TESTS = Path(__file__).resolve().parents[1]


def _cases():
    return [case for ns in HERE for case in cases_for_target(ns)]


def test_every_bundled_namespace_is_checked_somewhere():
    bundled = {r.namespace for r in get_host().records.values() if r.distribution == "atlas-ttm"}
    assert set(HERE) <= bundled
    elsewhere = set()
    for path in TESTS.rglob("*.py"):
        text = path.read_text(encoding="utf-8")
        if "parametrize_with_checks" in text and path.parent.name != "testing":
            elsewhere |= set(re.findall(r'namespace == "(\w+)"', text))
    missing = bundled - set(HERE) - elsewhere
    assert not missing, f"bundled namespaces without a conformance test: {sorted(missing)}"


@parametrize_with_checks(_cases())
def test_conformance(component, check):
    check(component)
