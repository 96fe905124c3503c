"""The parallelization-strategy contract and its dispatch.

A strategy says how a rule runs over time. It declares what it can run through
``supports(rule) -> (ok, reason)`` and runs it with ``run(rule, inputs) -> output``, where
``inputs`` is what the rule's `prepare` produced. ``core:sequential`` runs the rule's readable
`reference`; faster strategies are checked against it.

Dispatch (`resolve_strategy`):
- a strategy named explicitly (``"core:chunkwise"`` or ``{"use": "core:chunkwise", "chunk_size":
  64}``) that refuses the rule is an error that gives its reason;
- ``"auto"`` (or ``{"use": "auto", "allow": [...]}``) takes the highest-priority strategy that
  supports the rule among the bundled ones and the third-party ones the user allowed
  (`atlas_core.strategies.trust`), falling back to ``core:sequential``; the reasons others were
  passed over are logged at debug level.
"""

from __future__ import annotations

import logging
from typing import Any

from ..errors import StrategyError

log = logging.getLogger("atlas_core.strategies")


class Strategy:
    """Base class of strategies. ``name`` is set by the factory that builds it."""

    name: str = "?"
    #: whether `run` dispatches to kernel backends (`bound_backends`)
    uses_backends: bool = False
    #: the bound backends (`bind`): None until bound, False for a strategy without backends
    _backends: Any = None
    #: the kernel backend the user asked for by name (a strategy that `uses_backends` and takes a
    #: ``backend`` param returns it; None lets the backends' priorities choose)
    @property
    def requested_backend(self) -> str | None:
        return None

    def supports(self, rule) -> tuple[bool, str]:
        return True, ""

    def chunk_for(self, rule) -> int | None:
        """The chunk size this strategy runs ``rule`` with (what a kernel backend launches with);
        None for a strategy that does not run in chunks."""
        return None

    def bind(self, registry=None) -> "Strategy":
        """Resolve what this strategy needs from the registry (its kernel backends) once, when a
        rule or layer binds it; a call then makes no registry lookup."""
        if self.uses_backends:
            from ..backends import bind_backends

            self._backends = bind_backends(self.name, self.requested_backend, registry)
        else:
            self._backends = False  # bound: nothing to look up
        return self

    def bound_backends(self):
        if self._backends is None:  # a strategy object used unbound
            self.bind()
        return self._backends

    def run(self, rule, inputs):
        raise NotImplementedError

    def describe(self) -> str:
        return self.name


def _registry():
    from ..host.manager import get_registry

    return get_registry()


def build_strategy(value: Any, registry=None) -> Strategy:
    reg = registry or _registry()
    strat = reg.build("strategy", value, path="parallel")
    if not isinstance(strat, Strategy):
        raise StrategyError(f"strategy {value!r} did not build a Strategy object")
    return strat


def resolve_strategy(rule, value: Any = "auto", registry=None) -> Strategy:
    """The strategy that will run ``rule`` (see module docstring)."""
    from .trust import auto_allow, is_auto

    if isinstance(value, Strategy):
        strat = value
    elif is_auto(value):
        return auto_strategy(rule, registry, allow=auto_allow(value))
    else:
        strat = build_strategy(value, registry)
    ok, reason = strat.supports(rule)
    if not ok:
        raise StrategyError(f"strategy {strat.name} cannot run this rule: {reason}")
    if strat._backends is None:
        strat.bind(registry)
    return strat


def auto_strategy(rule, registry=None, allow=()) -> Strategy:
    """The strategy ``"auto"`` runs ``rule`` with: the highest-priority bundled or allowed
    (``allow``, or the environment's `trust.ALLOW_ENV`) strategy that supports it."""
    from .trust import allowed, announce, env_allowed

    reg = registry or _registry()
    names = set(allow) | env_allowed()
    comps = sorted(reg.all("strategy"), key=lambda c: (-c.priority, c.name))
    for comp in comps:
        if not allowed(comp, names):
            log.debug("strategy %s passed over: a third-party strategy that is not allowed (add %r to "
                      "parallel.allow or ATLAS_ALLOW_STRATEGIES)", comp.name, comp.namespace)
            continue
        strat = reg.build("strategy", comp.name)
        ok, reason = strat.supports(rule)
        if ok:
            announce(comp, allow)
            return strat.bind(reg)
        log.debug("strategy %s passed over: %s", comp.name, reason)
    return build_strategy("core:sequential", reg).bind(reg)
