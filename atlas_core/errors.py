"""Error types. Every user-facing error carries one actionable line.

`SpecError` collects many `Issue`s (each with a dotted path, the bad value and a hint) so that a
spec with several mistakes is reported once, completely. The CLI prints `str(error)` and exits 1;
`ATLAS_DEBUG=1` shows the traceback instead.
"""

from __future__ import annotations

import difflib
from dataclasses import dataclass
from typing import Any, Iterable


class AtlasError(Exception):
    """Base class of every error this package raises on purpose."""


@dataclass(frozen=True)
class Issue:
    path: str  # dotted path into the spec, e.g. "memory.algorithm.ns_steps"
    message: str
    value: Any = None
    hint: str | None = None

    def render(self) -> str:
        where = self.path or "<root>"
        text = f"{where}: {self.message}"
        if self.value is not None:
            text += f" (got {self.value!r})"
        if self.hint:
            text += f"; {self.hint}"
        return text


class SpecError(AtlasError, ValueError):
    """One or more problems in a spec or a component's parameters, reported together."""

    def __init__(self, issues: Iterable[Issue], source: str | None = None):
        self.issues = list(issues)
        self.source = source
        super().__init__(self._render())

    def _render(self) -> str:
        head = f"{self.source}: " if self.source else ""
        n = len(self.issues)
        if n == 1:
            return head + self.issues[0].render()
        lines = [f"{head}{n} problems:"] + [f"  - {i.render()}" for i in self.issues]
        return "\n".join(lines)

    def prefixed(self, prefix: str) -> "SpecError":
        """The same issues with `prefix.` put before every path."""
        issues = [
            Issue(f"{prefix}.{i.path}" if i.path else prefix, i.message, i.value, i.hint)
            for i in self.issues
        ]
        return SpecError(issues, self.source)


class UnknownComponentError(SpecError, KeyError):
    """A component name that no installed plugin provides."""

    def __str__(self) -> str:  # KeyError would quote the message
        return self._render()


class PluginError(AtlasError):
    """A plugin failed to load or registered something invalid."""


class StrategyError(AtlasError, ValueError):
    """A strategy or backend that was asked for cannot run this rule or call."""


def did_you_mean(name: str, candidates: Iterable[str]) -> str | None:
    """A 'did you mean' hint for a near-miss name, or None."""
    pool = list(candidates)
    close = difflib.get_close_matches(name, pool, n=3, cutoff=0.6)
    if not close and ":" in name:
        short = name.split(":", 1)[1]
        close = [c for c in pool if c.split(":", 1)[-1] == short]
        close = close or difflib.get_close_matches(
            short, [c.split(":", 1)[-1] for c in pool], n=3, cutoff=0.6
        )
        close = [c for c in pool if c.split(":", 1)[-1] in close][:3]
    if not close:
        return None
    if len(close) > 1:  # only the near-best: 'd_modle' suggests 'd_model', not also 'moe'
        ratio = {c: difflib.SequenceMatcher(None, name, c).ratio() for c in close}
        best = max(ratio.values())
        close = [c for c in close if ratio[c] >= best - 0.15]
    return "did you mean " + " or ".join(repr(c) for c in close) + "?"
