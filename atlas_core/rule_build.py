"""Building rules from specs: knob values, a preset, or a standalone rule (`build_rule`).

Every problem is collected into one `SpecError` at its dotted path. The rule classes are in
`atlas_core.composed_rule` and `atlas_core.rule_base`; `atlas_core.rule` (the call contract)
re-exports `build_rule`.
"""

from __future__ import annotations

from typing import Any, Mapping

from .errors import Issue, SpecError, did_you_mean
from .composed_rule import KNOB_DEFAULTS, KNOB_KINDS, RULE_KEYS, ComposedRule, check_anchor, check_steps
from .rule_base import Rule


#: The strategy a knob-composed rule runs with when neither the call nor its spec names one:
#: "auto", as a model built from a spec (the reference loop is ``parallel="core:sequential"``
#: in the spec, or ``strategy="core:sequential"`` in the call).
DEFAULT_STRATEGY = "auto"


# -- building -----------------------------------------------------------------------------------
def _registry(registry=None):
    if registry is not None:
        return registry
    from .host.manager import get_registry

    return get_registry()


def _canonical(value: Any) -> Any:
    """A knob value as written in a resolved spec."""
    if isinstance(value, Mapping):
        return dict(value)
    return value


def build_rule(spec: Any, *, heads: int | None = None, d_key: int | None = None,
               d_value: int | None = None, registry=None, path: str = "") -> Rule:
    """Build a rule from knob values, a preset, or a standalone rule.

    ``spec`` is ``{"structure": ..., "bias": ..., "retention": ..., "algorithm": ...,
    "feature_map": ..., "read": "after", "anchor": 1}`` (each knob ``"ns:name"`` or
    ``{"use": "ns:name", **params}``; missing knobs take the core defaults), or
    ``{"use": "ns:preset", <knob overrides>}``, or ``{"use": "ns:standalone_rule", **params}``.
    Every problem is collected into one `SpecError`.

    ``spec["parallel"]`` (optional) is the strategy a call without ``strategy=`` runs with; absent,
    a knob-composed rule runs `DEFAULT_STRATEGY` (``"auto"``: the strategy a model built from a
    spec would pick, resolved at the first call and cached) and a standalone rule its own
    default. ``{"parallel": "core:sequential"}`` keeps the reference loop.
    """
    reg = _registry(registry)
    if isinstance(spec, str):
        spec = {"use": spec}
    if not isinstance(spec, Mapping):
        raise SpecError([Issue(path, "a rule spec must be a table or a rule name", spec)])
    spec = dict(spec)
    pre = f"{path}." if path else ""
    parallel = spec.pop("parallel", None)
    if "use" in spec:
        comp = reg.get("rule", spec["use"], f"{pre}use")
        if "preset" not in comp.capabilities:
            anchor = spec.pop("anchor", 1)
            if anchor != 1:
                raise SpecError([Issue(
                    f"{pre}anchor", f"{comp.name} is a standalone rule with no inner gradient to "
                    "anchor; only knob-composed rules take an anchor", anchor, "remove anchor")])
            steps = spec.pop("steps_per_token", 1)
            if steps != 1:
                raise SpecError([Issue(
                    f"{pre}steps_per_token", f"{comp.name} is a standalone rule; only "
                    "knob-composed rules take sub-steps per token", steps, "remove steps_per_token")])
            rest = {k: v for k, v in spec.items() if k != "use"}
            params = comp.validate(rest, path)
            from .host.registry import BuildContext

            rule = comp.load_factory()(params, BuildContext(reg, path))
            rule.spec = {"use": comp.name, **rest}
            if parallel is not None:
                rule.default_strategy = parallel
            return _bound(rule, heads, d_key, d_value)
        knobs = {**KNOB_DEFAULTS, **comp.extra.get("knobs", {})}
        knobs.update({k: v for k, v in spec.items() if k != "use"})
        preset = comp.name
    else:
        knobs = {**KNOB_DEFAULTS, **spec}
        preset = None
    issues, built = [], {}
    steps = knobs.pop("steps_per_token", 1)
    for key in knobs:
        if key not in KNOB_DEFAULTS:
            hint = did_you_mean(key, RULE_KEYS) or f"allowed keys: {', '.join(RULE_KEYS)}"
            issues.append(Issue(f"{pre}{key}", "unknown key", None, hint))
    for key, kind in KNOB_KINDS.items():
        try:
            built[key] = reg.build(kind, knobs[key], path=f"{pre}{key}")
        except SpecError as exc:
            issues.extend(exc.issues)
    if knobs["read"] not in ("after", "before"):
        issues.append(Issue(f"{pre}read", "must be 'after' or 'before'", knobs["read"]))
    issues.extend(check_anchor(knobs["anchor"], f"{pre}anchor"))
    issues.extend(check_steps(steps, f"{pre}steps_per_token"))
    if issues:
        raise SpecError(issues)
    resolved = {k: _canonical(knobs[k]) for k in KNOB_DEFAULTS}
    if steps != 1:  # written only where it is set: a one-step rule's spec is unchanged
        resolved["steps_per_token"] = steps
    if preset:
        resolved = {"use": preset, **resolved}
    try:
        rule = ComposedRule(
            built["structure"], built["bias"], built["retention"], built["algorithm"],
            built["feature_map"], read=knobs["read"], spec=resolved,
            default_strategy=parallel if parallel is not None else DEFAULT_STRATEGY,
            anchor=knobs["anchor"], steps_per_token=steps,
        )
    except SpecError as exc:
        raise exc.prefixed(path) if path else exc
    return _bound(rule, heads, d_key, d_value)


def _bound(rule, heads, d_key, d_value):
    if heads is not None:
        rule.bind(heads, d_key, d_value if d_value is not None else d_key)
    return rule


def build_preset(params, ctx):  # pragma: no cover - presets are expanded by build_rule
    raise SpecError([Issue(ctx.path, "a preset is built through build_rule")])
