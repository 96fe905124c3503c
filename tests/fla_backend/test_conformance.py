"""The conformance kit on every ``fla:*`` backend, with the cases the plugin declares (each backend
on the presets its op computes, T = 70, head dims 16), fla's ops computed by the CPU stand-in."""

from __future__ import annotations

import pytest

pytest.importorskip("fla.ops")

from atlas_core.host.manager import get_registry  # noqa: E402
from atlas_core.testing import parametrize_with_checks  # noqa: E402
from atlas_core.testing.cases import declared_cases  # noqa: E402

CASES = [case for comp in get_registry().all() if comp.namespace == "fla" for case in declared_cases(comp)]


def test_every_backend_is_covered():
    assert {c.name for c in CASES} == {"fla:delta_rule", "fla:gated_delta_rule", "fla:kda", "fla:gla",
                                       "fla:simple_gla"}
    assert len(CASES) == 9  # one per preset


@parametrize_with_checks(CASES)
def test_conformance(component, check, stand_in):
    check(component)
