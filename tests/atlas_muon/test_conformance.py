"""The conformance kit on every ``atlas_muon:*`` component, with the cases the plugin declares
(Muon in the default composition and on deep memory behind a gated window; the presets; the
parallel strategy on the Atlas preset and, without recomputation, on the linear preset)."""

from __future__ import annotations

from atlas_core.host.manager import get_registry
from atlas_core.testing import parametrize_with_checks
from atlas_core.testing.cases import declared_cases

CASES = [case for comp in get_registry().all() if comp.namespace == "atlas_muon"
         for case in declared_cases(comp)]


def test_every_component_is_covered():
    names = {c.name for c in CASES}
    assert names == {"atlas_muon:muon", "atlas_muon:atlas_parallel", "atlas_muon:atlas",
                     "atlas_muon:atlas_linear"}


@parametrize_with_checks(CASES)
def test_conformance(component, check):
    check(component)
