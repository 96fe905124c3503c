"""The parallelization-strategy contract and its dispatch.

A strategy says how a rule runs over time. It declares what it can run through
``supports(rule) -> (ok, reason)`` and runs it with ``run(rule, inputs) -> output``, where
``inputs`` is what the rule's `prepare` produced. ``core:sequential`` runs the rule's readable
`reference`; faster strategies are checked against it.

Dispatch (`resolve_strategy`):
- a strategy named explicitly (``"core:chunkwise"`` or ``{"use": "core:chunkwise", "chunk_size":
  64}``) that refuses the rule is an error that gives its reason;
- ``"auto"`` (or ``{"use": "auto", "allow": [...]}``) takes the first strategy that supports the
  rule in the order of `atlas_core.strategies.trust.ranked`: the bundled ones by priority, then
  the third-party ones the user allowed, in the user's order (``allow = ["acme", "bundled"]``
  ranks acme's first; a plugin's own priority never outranks a bundled strategy), falling back to
  ``core:sequential``; the reasons others were passed over are logged at debug level.
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
    """The strategy ``"auto"`` runs ``rule`` with: the first that supports it in the order of
    `trust.ranked` (the bundled strategies by priority, then the allowed third-party ones in the
    user's order, unless ``allow`` ranks one before the entry ``"bundled"``; ``allow`` is the
    spec's or call's list, extended by `trust.ALLOW_ENV`), else ``core:sequential``."""
    from .trust import announce, ranked

    reg = registry or _registry()
    order, passed = ranked(reg.all("strategy"), allow)
    for comp in passed:
        log.debug("strategy %s passed over: a third-party strategy that is not allowed (add %r to "
                  "parallel.allow or ATLAS_ALLOW_STRATEGIES)", comp.name, comp.namespace)
    for comp, why in order:
        strat = reg.build("strategy", comp.name)
        ok, reason = strat.supports(rule)
        if ok:
            announce(comp, why)
            log.debug("strategy %s chosen: %s", comp.name, why)
            return strat.bind(reg)
        log.debug("strategy %s passed over: %s", comp.name, reason)
    return build_strategy("core:sequential", reg).bind(reg)
