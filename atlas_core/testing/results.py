"""The check catalogue's data types: `Check`, `CheckResult`, and the ways a check ends.

A check is a function of a resolved `Subject` (see `subject.py`). It returns normally when the
contract holds, raises `Failure(what, **numbers)` when it does not, and `Skip(reason)` when it
cannot run here (no other strategy supports the rule, a backend is unavailable, ...). The runner
turns a `Failure` into a message that names the check, states the contract clause, gives the
numbers and points to the clause in docs/plugins.md; `CheckFailed` carries that message (an
`AssertionError`, so pytest shows it as a plain test failure).

No torch here: the catalogue can be listed (`atlas check --list`, the docs meta-test) cheaply.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Iterable

DOCS = "docs/plugins.md"
STATUSES = ("passed", "failed", "xfail", "xpass", "skipped")

RULE_BEARING = frozenset(
    {"rule", "structure", "bias", "retention", "algorithm", "feature_map", "strategy"}
)
ALL_KINDS = frozenset(
    {"rule", "structure", "bias", "retention", "algorithm", "feature_map", "strategy", "backend",
     "arch", "task"}
)


class Failure(Exception):
    """Raised inside a check: the contract does not hold. ``numbers`` go into the message."""

    # the runner recognises outcomes by this tag, not by class identity, so that a second copy
    # of this module (pytester's in-process runs re-import modules) cannot turn a skip or a
    # failure into a crash
    atlas_check_outcome = "fail"

    def __init__(self, what: str, **numbers: Any) -> None:
        self.what = what
        self.numbers = numbers
        super().__init__(what)


class Skip(Exception):
    """Raised inside a check: it cannot run for this component here (with the reason)."""

    atlas_check_outcome = "skip"

    def __init__(self, reason: str) -> None:
        self.reason = reason
        super().__init__(reason)


class CheckFailed(AssertionError):
    """A failed check, with the full message (check name, numbers, contract, docs link)."""

    def __init__(self, check: str, message: str) -> None:
        self.check = check
        super().__init__(message)


def _fmt(value: Any) -> str:
    if isinstance(value, float):
        return f"{value:.3g}"
    if isinstance(value, (list, tuple)) and value and all(isinstance(v, float) for v in value):
        return "[" + ", ".join(f"{v:.3g}" for v in value) + "]"
    return str(value)


@dataclass(frozen=True)
class Check:
    """One named check of the catalogue."""

    name: str
    clause: str  # the contract, one sentence, as docs/plugins.md states it
    fn: Callable[[Any], None]
    kinds: frozenset[str]
    applies: Callable[[Any], bool] | None = None  # extra selection by capabilities/declarations

    @property
    def anchor(self) -> str:
        return f"{DOCS}#{self.name}"

    def selected_for(self, subject: Any) -> bool:
        if subject.kind not in self.kinds:
            return False
        return True if self.applies is None else bool(self.applies(subject))

    def message(self, failure: Failure, subject: Any = None) -> str:
        nums = ", ".join(f"{k.replace('_', ' ')}={_fmt(v)}" for k, v in failure.numbers.items())
        where = f" [{subject.id}]" if subject is not None else ""
        text = f"{self.name}{where} failed: {failure.what}"
        if nums:
            text += f" ({nums})"
        stop = "" if text.endswith((".", "?", "!")) else "."
        return f"{text}{stop} Contract: {self.clause} See {self.anchor}"

    def __repr__(self) -> str:  # pytest ids never use this (ids are built from names)
        return f"<check {self.name}>"


@dataclass
class CheckResult:
    name: str
    case: str
    status: str  # one of STATUSES
    message: str = ""
    reason: str = ""
    seconds: float = 0.0
    #: the strategy a failure arose under ("" for core:sequential or none)
    strategy: str = ""
    #: whose failure it is: the case's component, or a third-party strategy it ran under
    blame: str = ""
    #: what the check compared (strategies and variants) and its warnings
    notes: tuple[str, ...] = ()

    def as_dict(self) -> dict[str, Any]:
        return {
            "case": self.case,
            "check": self.name,
            "status": self.status,
            "message": self.message,
            "reason": self.reason,
            "seconds": round(self.seconds, 4),
            "strategy": self.strategy,
            "blame": self.blame,
            "notes": list(self.notes),
        }


# -- the catalogue ------------------------------------------------------------------------------
def register(
    name: str,
    clause: str,
    kinds: Iterable[str],
    applies: Callable[[Any], bool] | None = None,
) -> Callable[[Callable[[Any], None]], Callable[[Any], None]]:
    """Decorator that marks a function as a check (``fn.atlas_check``). `runner.catalogue`
    collects the marked functions of the check modules explicitly: no import-time registry."""

    def deco(fn: Callable[[Any], None]) -> Callable[[Any], None]:
        fn.atlas_check = Check(name, clause, fn, frozenset(kinds), applies)
        return fn

    return deco

