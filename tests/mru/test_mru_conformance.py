"""The conformance kit on every ``mru:*`` component, with the cases the plugin declares (the scan
strategies run on the ``mru:mru`` rule; the architecture with tiny sizes)."""

from __future__ import annotations

from atlas_core.host.manager import get_registry
from atlas_core.testing import parametrize_with_checks
from atlas_core.testing.cases import declared_cases

CASES = [case for comp in get_registry().all() if comp.namespace == "mru" for case in declared_cases(comp)]


def test_every_component_is_covered():
    names = {c.name for c in CASES}
    assert names == {"mru:mru", "mru:brent_kung", "mru:sklansky", "mru:hillis_steele", "mru:mru_lm"}


@parametrize_with_checks(CASES)
def test_conformance(component, check):
    check(component)
