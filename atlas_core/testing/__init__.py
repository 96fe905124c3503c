"""The conformance kit: the checks every component must pass, for plugin authors and for CI.

    from atlas_core.testing import Case, parametrize_with_checks

    @parametrize_with_checks([Case("acme:my_bias", params={"p": 3})])
    def test_conformance(component, check):
        check(component)

- `Case` names a component (and its params, and the composition a knob is tested in);
  `strategy_cases(name)` one case of a strategy per bundled rule preset;
- `parametrize_with_checks` makes one pytest test per applicable check;
- `check_component(case, on_fail="raise" | "collect")` runs them without pytest
  (`atlas check` is built on it) and returns `CheckResult`s;
- `catalogue()` lists the checks; docs/plugins.md documents each one.

Attributes load on first use: this package is imported by the pytest plugin at every pytest
start-up, so it must not import torch until a check runs.
"""

from __future__ import annotations

from ..lazy import lazy_attributes

_LAZY = {
    "Case": "atlas_core.testing.cases:Case",
    "DEFAULT_COMPOSITION": "atlas_core.testing.cases:DEFAULT_COMPOSITION",
    "strategy_cases": "atlas_core.testing.cases:strategy_cases",
    "CheckResult": "atlas_core.testing.results:CheckResult",
    "CheckFailed": "atlas_core.testing.results:CheckFailed",
    "Check": "atlas_core.testing.results:Check",
    "Failure": "atlas_core.testing.results:Failure",
    "Skip": "atlas_core.testing.results:Skip",
    "parametrize_with_checks": "atlas_core.testing.pytest_api:parametrize_with_checks",
    "check_component": "atlas_core.testing.runner:check_component",
    "catalogue": "atlas_core.testing.runner:catalogue",
    "cases_for_target": "atlas_core.testing.runner:cases_for_target",
    "run_cases": "atlas_core.testing.runner:run_cases",
    "configure": "atlas_core.testing.config:configure",
}

__all__ = list(_LAZY)


__getattr__, __dir__ = lazy_attributes(__name__, _LAZY, globals(), __all__)
