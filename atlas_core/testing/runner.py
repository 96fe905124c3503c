"""The plain runner: select the checks a component's kind and capabilities call for, run them,
collect `CheckResult`s. `atlas check` and `check_component` use it; pytest runs the same checks
one test each through `parametrize_with_checks`.
"""

from __future__ import annotations

import time
from contextlib import contextmanager
from dataclasses import dataclass
import warnings
from typing import Any, Iterable, Mapping

from .cases import Case, declared_cases
from .results import Check, CheckFailed, CheckResult, Failure


@dataclass(frozen=True, repr=False)
class RunnableCheck(Check):
    """A check of the catalogue as `catalogue` hands it out: callable on a subject."""

    def __call__(self, subject: Any) -> None:
        """Run on a resolved subject (what `parametrize_with_checks` hands to a test):
        raises `CheckFailed` on failure; a skip becomes ``pytest.skip`` under pytest."""
        result = run_one(self, subject)
        if result.status == "failed":
            raise CheckFailed(self.name, result.message)
        if result.status == "skipped":
            import pytest  # only reached under pytest

            pytest.skip(result.reason)


def catalogue() -> dict[str, Check]:
    """Every check, in catalogue order (importing the check modules registers them)."""
    from . import (checks_basic, checks_edges, checks_equivalence, checks_longrun, checks_numeric,
                   checks_strategy)

    found: dict[str, Check] = {}
    for module in (checks_basic, checks_edges, checks_numeric, checks_longrun, checks_equivalence,
                   checks_strategy):
        for obj in vars(module).values():
            check = getattr(obj, "atlas_check", None)
            if isinstance(getattr(check, "name", None), str) and callable(obj):
                if check.name in found and found[check.name].fn is not obj:
                    raise RuntimeError(f"two checks are named {check.name!r}")
                found[check.name] = RunnableCheck(check.name, check.clause, check.fn, check.kinds,
                                                  check.applies)
    order = [
        "check_resolves_by_name", "check_params_forbid_extra_keys", "check_params_roundtrip_toml",
        "check_entry_module_light", "check_capabilities_hold", "check_dtype_follows_inputs",
        "check_shapes_and_dtypes",
        "check_causal", "check_strategies_match_sequential", "check_state_carry", "check_split_calls",
        "check_gradients_finite", "check_boundary_inputs", "check_gradients_match_reference",
        "check_gradcheck_float64", "check_default_chunk_size", "check_strategy_on_every_rule",
        "check_deterministic_seed", "check_bf16_close_to_fp32", "check_long_sequence_stable",
        "check_memory_stays_alive", "check_reductions", "check_backend_matches_reference",
    ]
    rest = [n for n in found if n not in order]
    return {n: found[n] for n in order + rest if n in found}


def resolve(case: Case | str, host: Any = None):
    from .subject import Subject

    if isinstance(case, str):
        case = Case(case)
    return Subject(case, host=host)


def select_checks(subject, names: Iterable[str] | None = None) -> list[Check]:
    """The checks that apply to a subject. An unresolved subject gets the two checks that report
    why (resolution, and the entry module's import when its plugin is known)."""
    cat = catalogue()
    if subject.component is None:
        picked = [cat["check_resolves_by_name"]]
        if subject.host.records.get(subject.case.namespace) is not None:
            picked.append(cat["check_entry_module_light"])
    else:
        picked = [c for c in cat.values() if c.selected_for(subject)]
    if names is not None:
        wanted = set(names)
        picked = [c for c in picked if c.name in wanted]
    return picked


@contextmanager
def _one_thread():
    """Checks use tiny tensors: one intra-op thread is faster (thread start-up and contention
    dominate at these sizes) and makes timings steady. The caller's setting is restored."""
    import torch

    before = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(before)


def run_one(check: Check, subject, expected: Mapping[str, str] | None = None) -> CheckResult:
    """Run one check; failures and skips become results (a crash inside a check is a failure).
    A failure under a third-party strategy (not the case's own) is reported as that strategy's."""
    t0 = time.perf_counter()
    reason = (expected or {}).get(check.name)
    subject.notes = []
    subject.running = None
    status = "xfail" if reason else "failed"
    try:
        with _one_thread():
            check.fn(subject)
    except Exception as exc:  # noqa: BLE001 - a component that crashes fails the check, with the error
        notes = tuple(subject.notes)
        outcome = getattr(exc, "atlas_check_outcome", None)
        if outcome == "skip":
            return CheckResult(check.name, subject.id, "skipped", reason=exc.reason,
                               seconds=time.perf_counter() - t0, notes=notes)
        if outcome == "fail":
            title = exc.numbers.get("strategy") or _title(subject)
            msg = check.message(exc, subject)
        else:
            import traceback

            tb = traceback.extract_tb(exc.__traceback__)
            where = f" at {tb[-1].filename}:{tb[-1].lineno}" if tb else ""
            # a dtype slip found by check_dtype_follows_inputs is the likely cause of a crash in torch
            cause = getattr(subject, "dtype_problem", None)
            because = f" (likely because {cause}: see check_dtype_follows_inputs)" if cause else ""
            msg = check.message(Failure(f"raised {type(exc).__name__}: {exc}{where}{because}"), subject)
            title = _title(subject)
        strategy = _strategy_of(title)
        blame, msg = _blame(subject, strategy, msg)
        return CheckResult(check.name, subject.id, status, msg, reason or "", time.perf_counter() - t0,
                           strategy=strategy, blame=blame, notes=notes)
    status = "xpass" if reason else "passed"
    return CheckResult(check.name, subject.id, status, reason=reason or "", seconds=time.perf_counter() - t0,
                       notes=tuple(subject.notes))


def _title(subject) -> str:
    running = getattr(subject, "running", None)
    return running.title if running is not None else ""


def _strategy_of(title: Any) -> str:
    """``acme:fast(chunk_size=3) on the rule with anchor = 6`` -> ``acme:fast``."""
    if not isinstance(title, str) or ":" not in title:
        return ""
    name = title.split(" ", 1)[0].split("(", 1)[0].split("[", 1)[0]
    return "" if name == "core:sequential" else name


def _blame(subject, strategy: str, msg: str) -> tuple[str, str]:
    """(whose failure it is, the message): a third-party strategy that is not the case's own
    component (nor of its namespace) takes the blame, and the message says so first."""
    if not strategy or strategy == subject.name or getattr(subject, "registry", None) is None:
        return subject.id, msg
    try:
        comp = subject.registry.get("strategy", strategy)
    except Exception:  # noqa: BLE001 - not a registered strategy: nobody else to blame
        return subject.id, msg
    from atlas_core.strategies.trust import bundled, describe

    if bundled(comp) or comp.namespace == subject.name.split(":", 1)[0]:
        return subject.id, msg
    return comp.name, (f"the third-party strategy {describe(comp)} fails this check on {subject.id}, "
                       f"where core:sequential is the reference: the failure is the strategy's, not "
                       f"{subject.name}'s (a third-party strategy is certified by its own package's "
                       f"checks; see docs/plugins.md#writing-a-strategy). {msg}")


def warn_unmatched(expected: Mapping[str, str], selected: Iterable[str]) -> list[str]:
    """Warn about ``expected_failures`` keys that match no selected check; returns them."""
    from atlas_core.errors import did_you_mean

    selected = set(selected)
    known = set(catalogue())
    unmatched = []
    for key in expected:
        if key in selected:
            continue
        unmatched.append(key)
        if key in known:
            why = "no case selects it (it does not apply to these components)"
        else:
            why = did_you_mean(key, known) or "it is not a check name (see docs/plugins.md#the-check-catalogue)"
        warnings.warn(f"expected_failures entry {key!r} matches no check: {why}", UserWarning, stacklevel=3)
    return unmatched


def check_component(
    case: Case | str,
    on_fail: str = "raise",
    *,
    expected_failures: Mapping[str, str] | None = None,
    checks: Iterable[str] | None = None,
    host: Any = None,
) -> list[CheckResult]:
    """Run every check that applies to ``case``.

    ``on_fail="raise"`` raises `CheckFailed` at the first failure (with the full message);
    ``"collect"`` returns every result. ``expected_failures`` maps check names to reasons: such a
    failure is reported as ``xfail`` (and a pass as ``xpass``).
    """
    if on_fail not in ("raise", "collect"):
        raise ValueError(f"on_fail={on_fail!r} must be 'raise' or 'collect'")
    expected = dict(expected_failures or {})
    subject = resolve(case, host)
    selected = select_checks(subject, checks)
    warn_unmatched(expected, [c.name for c in selected])
    results = []
    for check in selected:
        res = run_one(check, subject, expected)
        results.append(res)
        if res.status == "failed" and on_fail == "raise":
            raise CheckFailed(res.name, res.message)
    return results


# -- targets of `atlas check` ---------------------------------------------------------------------
class TargetError(ValueError):
    """An `atlas check` target that names no namespace or component (one line, with a hint)."""


def cases_for_target(target: str, host: Any = None) -> list[Case]:
    """``"ns"`` -> the declared cases of every component of the namespace; ``"ns:name"`` -> that
    component's cases. A namespace whose plugin failed to load gives one case that reports it."""
    from atlas_core.errors import did_you_mean
    from atlas_core.host.manager import get_host

    host = host or get_host()
    reg = host.registry
    if ":" in target:
        found = reg.find(target)
        if not found:
            ns = target.split(":", 1)[0]
            rec = host.records.get(ns)
            if (rec is not None and rec.status == "failed") or (rec is None and ns in reg.unavailable):
                return [Case(target)]
            if rec is None:
                from atlas_core.host.registry import KNOWN_DISTRIBUTIONS

                dist = KNOWN_DISTRIBUTIONS.get(ns)
                hint = (f"namespace {ns!r} is not installed; it is provided by {dist}" if dist else
                        did_you_mean(ns, sorted(host.records))
                        or f"no installed plugin provides namespace {ns!r} (installed: {', '.join(sorted(host.records))})")
            else:
                pool = [c.name for c in reg.all()]
                hint = did_you_mean(target, pool) or "see `atlas components list`"
            raise TargetError(f"unknown component {target!r}; {hint}")
        return [case for comp in found for case in declared_cases(comp)]
    rec = host.records.get(target)
    if rec is None and target in reg.unavailable:  # refused: the case reports why
        return [Case(f"{target}:*", id=f"{target} (plugin)")]
    if rec is None:
        namespaces = sorted(host.records)
        hint = did_you_mean(target, namespaces) or f"installed namespaces: {', '.join(namespaces)}"
        comps = [c for c in reg.all() if c.name.split(":", 1)[1] == target]
        if len(comps) == 1:
            return declared_cases(comps[0])
        raise TargetError(f"unknown namespace {target!r}; {hint}")
    if rec.status == "disabled":
        raise TargetError(f"namespace {target!r} is disabled (ATLAS_DISABLE_PLUGINS)")
    if rec.status == "failed":
        return [Case(f"{target}:*", id=f"{target} (plugin)")]
    comps = [c for c in reg.all() if c.namespace == target]
    return [case for comp in comps for case in declared_cases(comp)]


def run_cases(cases: Iterable[Case], *, checks: Iterable[str] | None = None, host: Any = None,
              progress: Any = None) -> list[CheckResult]:
    results = []
    for case in cases:
        subject = resolve(case, host)
        for check in select_checks(subject, checks):
            if progress is not None:
                progress(subject.id, check.name)
            results.append(run_one(check, subject))
    return results
