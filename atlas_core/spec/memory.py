"""Resolving the ``[memory]`` table: validate by building the rule, then fill every default.

Validation builds the rule with `atlas_core.rule.build_rule` (which collects every knob error at
its dotted path and runs the knobs' composition checks) and the ``parallel`` strategy through the
registry (kind ``strategy``); an explicitly named strategy that refuses the rule is an error with
its reason. Building an unbound rule is cheap: no sizes are known, so no tensors are made.

Resolution writes every component as ``{"use": "ns:name", **every param with its default}``:

- a composed rule: ``structure``, ``bias``, ``retention``, ``algorithm``, ``feature_map``, ``read``
  (a preset keeps its ``use`` first, followed by all five knobs, so the resolved table reads back
  as the same preset with explicit overrides);
- a standalone rule (e.g. the MRU): ``{"use": rule, **params}``;
- ``parallel``: absent means ``"auto"``; ``"auto"`` is resolved to the strategy the dispatcher
  picks for this rule now (the highest-priority bundled strategy that supports it, e.g.
  ``core:chunkwise`` for composed rules, ``mru:brent_kung`` for the MRU, or a third-party one
  the spec allows with ``{ use = "auto", allow = ["ns"] }``: `atlas_core.strategies.trust`), so
  a saved spec rebuilds the same computation even after other plugins are installed. A model trained from a spec therefore uses
  a parallel form by default; write ``parallel = "core:sequential"`` for the reference loop.

The rule built here, with the strategy resolved for it (auto's choice and every ``supports()``
it asks, or the named strategy's check, made once) and bound, is kept with the resolved spec
(`resolve_memory_plan`, `atlas_core.layer.MemoryPlan`): a model built from that spec copies the
rule for each layer and makes neither again.

Component params nested inside a knob's params (an Omega window's ``inner`` bias) are kept as
the knob's params model returns them; they are not expanded.
"""

from __future__ import annotations

from typing import Any, Mapping

from ..errors import AtlasError, Issue, SpecError, StrategyError
from ..host.registry import Registry, split_use
from ..params import plain  # noqa: F401  (re-exported: spec.resolve reads it from here)

DEFAULT_PARALLEL = "auto"


def canonical_component(reg: Registry, kind: str, value: Any, path: str) -> dict[str, Any]:
    """``"ns:name"`` or ``{"use": ..., **params}`` -> ``{"use": full name, **all params}``."""
    name, raw = split_use(value, path)
    comp = reg.get(kind, name, f"{path}.use" if isinstance(value, Mapping) else path)
    params = comp.validate(raw, path)
    return {"use": comp.name, **(plain(params) if params is not None else {})}


def _canonical_rule(rule: Any, reg: Registry) -> dict[str, Any]:
    from ..rule import KNOB_KINDS

    raw = dict(rule.spec)
    use = raw.get("use")
    out: dict[str, Any] = {}
    if use is not None:
        comp = reg.get("rule", use, "memory.use")
        if "preset" not in comp.capabilities:  # a standalone rule and its params
            rest = {k: v for k, v in raw.items() if k != "use"}
            params = comp.validate(rest, "memory")
            return {"use": comp.name, **(plain(params) if params is not None else {})}
        out["use"] = comp.name
    for key, kind in KNOB_KINDS.items():
        out[key] = canonical_component(reg, kind, raw[key], f"memory.{key}")
    out["read"] = raw.get("read", "after")
    out["anchor"] = raw.get("anchor", 1)
    if raw.get("steps_per_token", 1) != 1:  # sub-steps per token (Gated DeltaProduct)
        out["steps_per_token"] = raw["steps_per_token"]
    return out


def _resolve_parallel(value: Any, rule: Any, reg: Registry, issues: list[Issue]) -> tuple[Any, Any]:
    """The resolved ``parallel`` table and the strategy object ``rule`` runs with (None where the
    rule has errors), or (None, None) with the problem appended to ``issues``. The
    strategy is resolved through ``rule.runner(value)`` (`atlas_core.strategies.base.resolve_strategy`):
    auto's choice, or the named strategy's ``supports()`` check, is made here once and cached on
    ``rule`` with the bound strategy, which the build reuses (`atlas_core.layer.MemoryPlan`)."""
    path = "memory.parallel"
    from ..strategies.trust import auto_allow, is_auto

    if is_auto(value):  # "auto" or { use = "auto", allow = [...] } (strategies/trust.py)
        try:
            auto_allow(value, path)
        except SpecError as exc:
            issues.extend(exc.issues)
            return None, None
        if rule is None:
            return None, None  # the rule has errors; they are reported already
        try:
            chosen = rule.runner(value, reg)
        except (AtlasError, ValueError) as exc:
            issues.append(Issue(path, f"no strategy can run this rule: {exc}", value))
            return None, None
        return canonical_component(reg, "strategy", chosen.name, path), chosen
    try:
        resolved = canonical_component(reg, "strategy", value, path)
        strategy = reg.build("strategy", value, path=path)
    except SpecError as exc:
        issues.extend(exc.issues)
        return None, None
    except (AtlasError, ValueError) as exc:
        issues.append(Issue(path, str(exc), value))
        return None, None
    from ..strategies.base import Strategy

    if rule is None or not isinstance(strategy, Strategy):
        return resolved, None
    try:
        return resolved, rule.runner(strategy, reg)  # supports() once; bound
    except StrategyError as exc:
        reason = str(exc).split(": ", 1)[-1]
        issues.append(Issue(path, f"{resolved['use']} cannot run this rule: {reason}", value,
                            'use "auto" or "core:sequential"'))
    except (AtlasError, ValueError) as exc:
        issues.append(Issue(path, str(exc), value))
    return resolved, None


def resolve_memory_plan(table: Any, reg: Registry, issues: list[Issue]) -> tuple[dict[str, Any] | None, Any]:
    """`resolve_memory`, and the rule it built with its strategy resolved (`atlas_core.layer.MemoryPlan`),
    or None with the problems appended to ``issues``."""
    if isinstance(table, str):  # memory = "titans:titans": a rule or preset name alone
        table = {"use": table}
    if not isinstance(table, Mapping):
        issues.append(Issue("memory", "must be a table (a [memory] section)", table))
        return None, None
    from ..rule import build_rule

    t = dict(table)
    parallel = t.pop("parallel", DEFAULT_PARALLEL)
    rule, resolved = None, None
    try:
        rule = build_rule(t, registry=reg, path="memory")
        resolved = _canonical_rule(rule, reg)
    except SpecError as exc:
        issues.extend(exc.issues)
        rule = None
    except (AtlasError, ValueError) as exc:  # a factory refusing its params
        issues.append(Issue("memory", str(exc)))
        rule = None
    table_p, strategy = _resolve_parallel(parallel, rule, reg, issues)
    if resolved is None or table_p is None:
        return None, None
    resolved["parallel"] = table_p
    if strategy is None:  # a strategy object of a kind the layer does not run: built again there
        return resolved, None
    from ..layer import MemoryPlan

    return resolved, MemoryPlan(rule, strategy, reg)


def resolve_memory(table: Any, reg: Registry, issues: list[Issue]) -> dict[str, Any] | None:
    """The resolved ``[memory]`` table, or None with the problems appended to ``issues``."""
    return resolve_memory_plan(table, reg, issues)[0]
