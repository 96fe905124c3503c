"""Which strategies ``"auto"`` may choose, and in which order: the bundled ones first, then the
third-party ones the user allowed, unless the user ranks one before the bundled ones.

A strategy changes how fast a rule runs, never what it computes, but only the conformance kit
checks that, and training and inference never run the kit. So ``"auto"`` (the strategy of a spec
without ``parallel``) chooses among the strategies that ship with atlas (their namespace is owned
by the core's distribution, `atlas_core.host.registry.NAMESPACE_OWNERS`) and the third-party ones
the user allowed by namespace (``acme``) or by full name (``acme:chunked``):

- in the spec: ``parallel = { use = "auto", allow = ["acme"] }``;
- in the environment: ``ATLAS_ALLOW_STRATEGIES=acme,other:fast`` (comma-separated), for every
  spec and every ``rule(..., strategy="auto")`` call of the process.

Allowing makes a strategy a *candidate*, not a winner: a plugin's own ``priority`` only orders
the strategies of one allow entry among themselves, never against the bundled ones. The order
``"auto"`` tries (`ranked`): the entries of the ``allow`` list in the user's order, the spec's
first and then the environment's, with the bundled strategies (by their priorities,
`BUNDLED_PRIORITIES` in docs/plugins.md) at the place of the reserved entry ``"bundled"``, or
before every allowed one when the list has no such entry; ``core:sequential`` last, as the
fallback. So ``allow = ["acme"]`` lets acme's strategies run the rules no bundled strategy runs,
and ``allow = ["acme", "bundled"]`` tries acme's first.

Naming a strategy explicitly (``parallel = "acme:chunked"``) always runs it. A third-party
strategy that ``"auto"`` chooses says so once per process, with why (a warning on the
``atlas_core.strategies`` logger); the strategies passed over are logged at debug level with
their reasons; and `describe` names the distribution of any strategy, for ``atlas spec show``,
the saved spec and the ``atlas train`` start line.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Mapping
from typing import Any, Iterable

from ..errors import Issue, SpecError

ALLOW_ENV = "ATLAS_ALLOW_STRATEGIES"
AUTO_KEYS = ("use", "allow")
#: the reserved ``allow`` entry that marks where the bundled strategies rank
BUNDLED = "bundled"
SEQUENTIAL = "core:sequential"

log = logging.getLogger("atlas_core.strategies")
_announced: set[str] = set()


def env_allow_list() -> tuple[str, ...]:
    """The entries of `ALLOW_ENV`, in their order."""
    return tuple(dict.fromkeys(s.strip() for s in os.environ.get(ALLOW_ENV, "").split(",") if s.strip()))


def env_allowed() -> set[str]:
    """The namespaces and names allowed by `ALLOW_ENV`."""
    return set(env_allow_list())


def is_auto(value: Any) -> bool:
    """``"auto"``, None, or a table ``{use = "auto", allow = [...]}``."""
    if value is None or value == "auto":
        return True
    return isinstance(value, Mapping) and value.get("use") == "auto"


def auto_allow(value: Any, path: str = "parallel") -> tuple[str, ...]:
    """The ``allow`` list of an ``"auto"`` value (empty for the plain string); a `SpecError`
    naming the key for anything else in the table."""
    if not isinstance(value, Mapping):
        return ()
    unknown = sorted(set(value) - set(AUTO_KEYS))
    if unknown:
        raise SpecError([Issue(f"{path}.{unknown[0]}", "unknown key", value[unknown[0]],
                               'an "auto" table takes only use = "auto" and allow = ["namespace", ...]')])
    allow = value.get("allow", [])
    if isinstance(allow, str) or not isinstance(allow, (list, tuple)) or not all(
            isinstance(a, str) and a for a in allow):
        raise SpecError([Issue(f"{path}.allow", "must be a list of plugin namespaces or strategy names",
                               allow, 'e.g. allow = ["acme"], allow = ["acme:chunked"], or '
                               'allow = ["acme", "bundled"] to try acme before the bundled strategies')])
    return tuple(allow)


def allow_list(allow: Iterable[str] = ()) -> tuple[str, ...]:
    """The ordered entries ``"auto"`` ranks by: ``allow`` (the spec's or the call's), then the
    entries of `ALLOW_ENV` it does not already have."""
    return tuple(dict.fromkeys([*allow, *env_allow_list()]))


def ranked(components: Iterable[Any], allow: Iterable[str] = ()) -> tuple[list[tuple[Any, str]], list[Any]]:
    """The strategies ``"auto"`` tries, in order, each with why it ranks there, and the
    third-party ones it passes over (not allowed). ``core:sequential`` is not among them: it is
    the fallback. Order: the entries of `allow_list` in the user's order; the bundled strategies
    (by their declared priority) at the place of the entry `BUNDLED`, or first; within one entry,
    by declared priority then name. A third-party ``priority`` never outranks a bundled strategy."""
    entries = allow_list(allow)
    where_bundled = entries.index(BUNDLED) if BUNDLED in entries else -1
    order, passed = [], []
    for comp in components:
        if comp.name == SEQUENTIAL:
            continue
        if bundled(comp):
            order.append(((where_bundled, -comp.priority, comp.name), comp, "bundled"))
            continue
        hits = [i for i, e in enumerate(entries) if e in (comp.name, comp.namespace)]
        if not hits:
            passed.append(comp)
            continue
        i = hits[0]
        place = ("before the bundled strategies" if i < where_bundled else
                 "after the bundled strategies (none of them runs this rule)")
        order.append(((i, -comp.priority, comp.name), comp, f"allowed by {_by(comp, entries, allow)}, "
                      f"ranked {place}"))
    order.sort(key=lambda item: item[0])
    return [(comp, why) for _, comp, why in order], passed


def _by(component: Any, entries: tuple[str, ...], allow: Iterable[str]) -> str:
    """Where ``component`` is allowed: ``allow = ['acme', 'bundled']`` or ``ATLAS_ALLOW_STRATEGIES=acme``."""
    spec = tuple(allow)
    if any(e in (component.name, component.namespace) for e in spec):
        return f"allow = {list(spec)!r}"
    return f"{ALLOW_ENV}={os.environ.get(ALLOW_ENV, '')}"


def bundled(component: Any) -> bool:
    """Whether a registered component ships with atlas: its namespace is owned by the core's
    distribution and that distribution provided it."""
    from ..host.registry import NAMESPACE_OWNERS, canonical_distribution

    owner = NAMESPACE_OWNERS["core"]
    return (NAMESPACE_OWNERS.get(component.namespace) == owner
            and canonical_distribution(component.provider.distribution) == owner)


def allowed(component: Any, allow: Iterable[str]) -> bool:
    """Whether ``"auto"`` may choose ``component``: bundled, or allowed by namespace or name."""
    if bundled(component):
        return True
    names = set(allow)
    return component.namespace in names or component.name in names


def describe(component: Any) -> str:
    """``core:chunkwise (atlas-ttm 0.1.0)``; ``acme:fast (acme-fast 0.2, third-party)``."""
    p = component.provider
    third = "" if bundled(component) else ", third-party"
    return f"{component.name} ({p.distribution} {p.version}{third})"


def announce(component: Any, why: str) -> None:
    """Say once per process that ``"auto"`` chose an allowed third-party strategy, and why
    (`ranked`'s reason: where it was allowed and where it ranks)."""
    if bundled(component) or component.name in _announced:
        return
    _announced.add(component.name)
    log.warning('parallel "auto" chose the third-party strategy %s, %s; the conformance kit '
                "certifies it only in its own package's checks", describe(component), why)


def _strategy_component(parallel: Any, registry: Any = None) -> Any:
    """The registered strategy a resolved spec's ``parallel`` names (None when it cannot be looked up)."""
    try:
        from ..host.manager import get_registry
        from ..host.registry import split_use

        name, _ = split_use(parallel)
        return (registry or get_registry()).get("strategy", name)
    except Exception:  # noqa: BLE001 - a note, never an error
        return None


def parallel_note(parallel: Any, registry: Any = None) -> str | None:
    """One line naming a resolved spec's strategy and its distribution (None when it cannot be
    looked up): ``parallel: core:chunkwise (atlas-ttm 0.1.0)``."""
    comp = _strategy_component(parallel, registry)
    return None if comp is None else f"parallel: {describe(comp)}"


def parallel_info(parallel: Any, registry: Any = None) -> dict[str, Any] | None:
    """The same as data: ``{"strategy", "distribution", "version", "third_party"}`` (None when the
    strategy cannot be looked up)."""
    comp = _strategy_component(parallel, registry)
    if comp is None:
        return None
    p = comp.provider
    return {"strategy": comp.name, "distribution": p.distribution, "version": p.version,
            "third_party": not bundled(comp)}
