from atlas_core.testing import Case, parametrize_with_checks

CASES = [Case("acme_gate:beta_l2"), Case("acme_gate:beta_delta")]


@parametrize_with_checks(CASES)
def test_conformance(component, check):
    check(component)
