from atlas_core.testing import Case, parametrize_with_checks

CASES = [Case("acme_nlms:nlms", params={"delta": 0.1}), Case("acme_nlms:nlms_delta")]


@parametrize_with_checks(CASES)
def test_conformance(component, check):
    check(component)
