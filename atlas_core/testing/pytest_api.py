"""`parametrize_with_checks`: one pytest test per (component, check), as scikit-learn does for
estimators.

    from atlas_core.testing import Case, parametrize_with_checks

    @parametrize_with_checks([Case("acme:my_bias", params={"p": 3})],
                             expected_failures={"check_bf16_close_to_fp32": "kernel pending"})
    def test_conformance(component, check):
        check(component)

Ids are ``<case id>-<check name>`` (``acme:my_bias(p=3)-check_causal``). An expected failure is
marked ``xfail`` (non-strict: a fixed component shows as XPASS); an ``expected_failures`` key
that matches no selected check is reported with a warning naming it.
"""

from __future__ import annotations

from typing import Iterable, Mapping

from .cases import Case
from .results import CheckFailed
from .runner import resolve, select_checks, warn_unmatched


def parametrize_with_checks(
    cases: Iterable[Case | str],
    expected_failures: Mapping[str, str] | None = None,
    *,
    checks: Iterable[str] | None = None,
):
    """A ``pytest.mark.parametrize("component, check", ...)`` over every check that applies to
    every case. ``checks`` restricts the run to some check names."""
    import pytest

    expected = dict(expected_failures or {})
    params, selected, seen = [], set(), set()
    for case in cases:
        case = Case(case) if isinstance(case, str) else case
        subject = resolve(case)
        if subject.id in seen:
            raise ValueError(f"two cases have the id {subject.id!r}; give one of them Case(..., id=...)")
        seen.add(subject.id)
        for check in select_checks(subject, checks):
            selected.add(check.name)
            marks = [pytest.mark.atlas_conformance]
            if check.name in expected:
                marks.append(pytest.mark.xfail(reason=expected[check.name], raises=CheckFailed, strict=False))
            params.append(pytest.param(subject, check, id=f"{subject.id}-{check.name}", marks=marks))
    warn_unmatched(expected, selected)
    return pytest.mark.parametrize("component, check", params)
