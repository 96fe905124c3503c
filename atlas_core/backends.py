"""Kernel backends: where a strategy runs (PyTorch reference, Triton, CUDA).

Modelled on flash-linear-attention's backend dispatcher. A backend is a registered component of
kind ``backend`` whose ``extra["strategy"]`` names the strategy it accelerates (or whose
``extra["strategies"]`` lists several). It has a name, a
priority, an availability probe, and a per-call verifier returning ``(ok, reason)``. The
strategy's own PyTorch code is always the fallback.

Switches:
- ``ATLAS_DISABLE_BACKENDS=all`` (or a comma-separated list of backend names) disables backends;
- ``ATLAS_BACKEND=<name>`` or a strategy's ``backend = "<name>"`` parameter forces one: if it
  cannot serve the call, the error names the backend and the verifier's reason (no silent
  fallback). ``backend = "torch"`` forces the PyTorch code.
- A backend that can serve a call but measured slower than the PyTorch code for it says so in
  ``prefers``; automatic dispatch then runs the PyTorch code (forcing still runs the backend).
- A backend that must first be checked on the device it would run on (fla's kernels: only after
  the conformance kit passed there) says so in ``certified``; automatic dispatch passes over it
  until then (forcing still runs it).

Why a backend was passed over is logged at debug level and shown by `atlas env`.
"""

from __future__ import annotations

import logging
import os
from typing import Any

from .errors import StrategyError

log = logging.getLogger("atlas_core.backends")
DISABLE_ENV = "ATLAS_DISABLE_BACKENDS"
FORCE_ENV = "ATLAS_BACKEND"


class Backend:
    """Base class of kernel backends."""

    name: str = "?"

    def is_available(self) -> tuple[bool, str]:
        return True, ""

    def verify(self, strategy, rule, inputs) -> tuple[bool, str]:
        return True, ""

    def certified(self) -> tuple[bool, str]:
        """Whether automatic dispatch may choose this backend once it is available: False (with
        the reason) for a backend that must first pass the conformance kit on this device (the
        ``fla`` plugin's). Read when backends are bound and by `explain`; a forced backend runs
        without it."""
        return True, ""

    def prefers(self, strategy, rule, inputs) -> tuple[bool, str]:
        """Whether this backend should serve a call it can serve when nobody forced it: False
        (with the reason) where it measured slower than the strategy's PyTorch code. Consulted
        after `verify` and only for automatic dispatch; a forced backend always runs."""
        return True, ""

    def run(self, strategy, rule, inputs):
        raise NotImplementedError


def _disabled() -> set[str] | bool:
    raw = os.environ.get(DISABLE_ENV, "").strip()
    if raw.lower() in {"1", "all", "true", "yes"}:
        return True
    return {s.strip() for s in raw.split(",") if s.strip()}


def _certified(be) -> tuple[bool, str]:
    """`Backend.certified`, for duck-typed plugin backends too (no method: certified)."""
    fn = getattr(be, "certified", None)
    if fn is None:
        return True, ""
    try:
        return fn()
    except Exception as exc:  # noqa: BLE001 - a lookup must never break dispatch or `atlas env`
        return False, f"its certification lookup failed: {type(exc).__name__}: {exc}"


def backends_for(strategy_name: str, registry=None):
    if registry is None:
        from .host.manager import get_registry

        registry = get_registry()
    def serves(c) -> bool:
        names = set(c.extra.get("strategies", ())) | {c.extra.get("strategy")}
        return strategy_name in names

    comps = [c for c in registry.all("backend") if serves(c)]
    return registry, sorted(comps, key=lambda c: (-c.priority, c.name))


def explain(strategy_name: str, registry=None) -> list[dict[str, Any]]:
    """For each backend of a strategy: would it be considered, and why not (no call needed)."""
    reg, comps = backends_for(strategy_name, registry)
    disabled = _disabled()
    try:  # a backend registered for a strategy whose `run` never consults its backends
        dispatches = bool(getattr(reg.build("strategy", strategy_name), "uses_backends", True))
    except Exception:  # noqa: BLE001 - `atlas env` must not break on a strategy that fails to build
        dispatches = True
    rows = []
    for comp in comps:
        row = {"backend": comp.name, "priority": comp.priority, "status": "available", "reason": ""}
        if disabled is True or (isinstance(disabled, set) and comp.name in disabled):
            row.update(status="disabled", reason=f"{DISABLE_ENV} is set")
        else:
            try:
                be = reg.build("backend", comp.name)
                ok, why = be.is_available()
            except Exception as exc:  # noqa: BLE001 - a probe must never break `atlas env`
                ok, why = False, f"probe failed: {type(exc).__name__}: {exc}"
            if not ok:
                row.update(status="unavailable", reason=why)
            else:
                ok, why = _certified(be)
                if not ok:  # runs when forced, but "auto" passes over it
                    row.update(status="uncertified", reason=why)
            if not dispatches:
                row.update(status="unused", reason=f"{strategy_name} does not hand its calls to "
                           "kernel backends (it runs its PyTorch code)" + (f"; {row['reason']}" if row["reason"] else ""))
        rows.append(row)
    return rows


class BoundBackends:
    """The backends of one strategy, looked up, built and probed once (`bind_backends`); each
    call then only runs their per-call verifiers (`select`)."""

    def __init__(self, strategy_name: str, requested: str | None, candidates: list) -> None:
        self.strategy_name = strategy_name
        self.requested = requested
        self.candidates = candidates  # [(name, backend or None, reason it is out)]

    def select(self, strategy, rule, inputs):
        """The backend that will serve this call, or None for the strategy's PyTorch code."""
        if self.requested == "torch":
            return None
        for name, be, reason in self.candidates:
            if be is not None:
                ok, why = be.verify(strategy, rule, inputs)
                prefers = getattr(be, "prefers", None)  # a duck-typed plugin backend may lack it
                if ok and not self.requested and prefers is not None:
                    ok, slower = prefers(strategy, rule, inputs)
                    if not ok:
                        log.debug("backend %s passed over for %s: %s", name, self.strategy_name, slower)
                        continue
                if ok:
                    log.debug("backend %s serves %s", name, self.strategy_name)
                    return be
                reason = f"refused this call: {why}"
            if self.requested:
                raise StrategyError(f"backend {name} was requested but {reason}")
            log.debug("backend %s passed over for %s: %s", name, self.strategy_name, reason)
        return None


def bind_backends(strategy_name: str, requested: str | None = None, registry=None) -> BoundBackends:
    """Look up, build and probe the backends of a strategy once (the switches are read now)."""
    requested = requested or os.environ.get(FORCE_ENV) or None
    if requested == "torch":
        return BoundBackends(strategy_name, requested, [])
    reg, comps = backends_for(strategy_name, registry)
    if requested and requested not in {c.name for c in comps}:
        names = ", ".join(c.name for c in comps) or "none registered"
        raise StrategyError(
            f"backend {requested!r} does not serve {strategy_name} (its backends: {names}, or 'torch')"
        )
    disabled = _disabled()
    candidates = []
    for comp in comps:
        if requested and comp.name != requested:
            continue
        if not requested and (disabled is True or comp.name in disabled):
            candidates.append((comp.name, None, f"disabled by {DISABLE_ENV}"))
            continue
        be = reg.build("backend", comp.name)
        ok, why = be.is_available()
        reason = "" if ok else f"unavailable: {why}"
        if ok and not requested:
            ok, why = _certified(be)
            reason = "" if ok else f"not certified: {why}"
        candidates.append((comp.name, be if ok else None, reason))
    return BoundBackends(strategy_name, requested, candidates)


def select_backend(strategy, rule, inputs, requested: str | None = None):
    """The backend that will serve this call, or None for the strategy's PyTorch code (looks the
    backends up now; strategies bind them once instead, `Strategy.bound_backends`)."""
    return bind_backends(strategy.name, requested).select(strategy, rule, inputs)
