"""`Case`: one component to put through the checks, and the ids tests are named by.

    Case("miras:lp", params={"p": 3})                       # a knob, in the default composition
    Case("miras:kl", rule={"algorithm": "core:momentum"})   # ... in a composition of your choice
    Case("miras:moneta")                                    # a rule preset (or a standalone rule)
    Case("core:chunkwise", params={"chunk_size": 4})        # a strategy, run on `rule`
    Case("acme:my_bias", reductions=[{"name": "s1_is_l2", "params": {"scale": 1.0},
                                      "equals": {"bias": "core:l2"}}])

A component may declare the cases `atlas check` uses for it at registration
(``registry.add(..., check_cases=[{"params": {...}}, ...])``); without them it is checked once with
its default params. Ids are built from the name and the params (``miras:lp(p=3)``), never from
object reprs, so they are stable across runs and readable in reports.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Mapping, Sequence

# The composition a knob is tested in when the case names none: every core gate is exercised
# (alpha by decay, eta and theta by momentum).
DEFAULT_COMPOSITION: dict[str, Any] = {
    "structure": "core:linear",
    "bias": "core:l2",
    "retention": "core:decay",
    "algorithm": "core:momentum",
    "feature_map": "core:identity",
    "read": "after",
}

# Sizes of the random calls. Dk = Dv because deep memories with a residual need it; the shapes
# check also tries Dv = Dk + 1 on every rule that builds with it (to catch transposed axes).
DEFAULT_SIZES: dict[str, int] = {"B": 2, "T": 7, "H": 3, "Dk": 4, "Dv": 4}


def _short(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, float):
        return f"{value:g}"
    if isinstance(value, (int, str)):
        return str(value)
    if isinstance(value, Mapping):
        if "use" in value and len(value) == 1:
            return _short(value["use"])
        inner = ",".join(f"{k}={_short(v)}" for k, v in sorted(value.items()))
        return "{" + inner + "}"
    if isinstance(value, (list, tuple)):
        return "[" + ",".join(_short(v) for v in value) + "]"
    return type(value).__name__  # never an object repr (addresses change between runs)


def params_id(params: Mapping[str, Any]) -> str:
    return ",".join(f"{k}={_short(v)}" for k, v in sorted(params.items()))


@dataclass(frozen=True)
class Case:
    """A component under test.

    - ``name``: ``"ns:name"`` of any registered component (rule preset, standalone rule, knob,
      strategy, backend, arch, task).
    - ``params``: the component's params (validated by its own model).
    - ``rule``: for a knob, the composition it is placed in (knob values, or a preset name; the
      knob under test takes its slot); for a strategy or backend, the rule it runs. Default:
      `DEFAULT_COMPOSITION`.
    - ``strategy``: for a rule or knob, the strategies to compare with ``core:sequential`` (a spec
      or a list of specs). Default: every bundled strategy that supports the rule (or those
      chosen in the kit's config: `KitConfig.strategies`).
    - ``kind``: only needed when the name is registered under two kinds.
    - ``reductions``: extra reductions to check, in the declaration format of docs/plugins.md.
    - ``sizes``: overrides of `DEFAULT_SIZES` (B, T, H, Dk, Dv).
    - ``id``: a custom test id (default: name and params).
    """

    name: str
    params: Mapping[str, Any] = field(default_factory=dict)
    rule: Any = None
    strategy: Any = None
    kind: str | None = None
    reductions: Sequence[Mapping[str, Any]] = ()
    sizes: Mapping[str, int] | None = None
    id: str | None = None

    def __post_init__(self) -> None:
        if not isinstance(self.name, str) or ":" not in self.name:
            raise ValueError(
                f"Case name {self.name!r} must be a component name 'namespace:name' "
                "(see `atlas components list`)"
            )
        if not isinstance(self.params, Mapping):
            raise ValueError(f"Case params must be a mapping, got {type(self.params).__name__}")
        if self.sizes is not None:
            bad = sorted(set(self.sizes) - set(DEFAULT_SIZES))
            if bad:
                raise ValueError(f"Case sizes {bad} are unknown; allowed: {', '.join(DEFAULT_SIZES)}")

    @property
    def case_id(self) -> str:
        if self.id:
            return self.id
        text = self.name
        if self.params:
            text += f"({params_id(self.params)})"
        if self.rule is not None:
            text += f"@{_short(self.rule)}"
        return text

    @property
    def namespace(self) -> str:
        return self.name.split(":", 1)[0]

    def size(self, key: str) -> int:
        return int((self.sizes or {}).get(key, DEFAULT_SIZES[key]))


def declared_cases(component: Any) -> list[Case]:
    """The cases a registered component declares for itself (``check_cases=[...]``), or one case
    with its default params."""
    raw = component.extra.get("check_cases") if component.extra else None
    if not raw:
        return [Case(component.name, kind=component.kind)]
    out = []
    for entry in raw:
        entry = dict(entry)
        entry.setdefault("kind", component.kind)
        out.append(Case(component.name, **entry))
    return out


def strategy_cases(name: str, params: Mapping[str, Any] | None = None,
                   rules: Sequence[Any] | None = None) -> list[Case]:
    """One `Case` of the strategy ``name`` per rule it is certified on: ``rules`` (preset names
    or rule specs), by default the default composition and every bundled rule preset. A rule the
    strategy refuses gets its strategy checks skipped with the refusal, not failed."""
    if rules is None:
        from atlas_core.host.manager import get_registry
        from atlas_core.strategies.trust import bundled

        presets = [c.name for c in get_registry().all("rule") if "preset" in c.capabilities and bundled(c)]
        rules = [DEFAULT_COMPOSITION, *presets]
    return [Case(name, params=dict(params or {}), rule=r, kind="strategy") for r in rules]
