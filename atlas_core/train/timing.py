"""When a run's steps happen: the first step's time (warm-up, and compilation when asked), the
estimate of the whole run once a few steps followed it, and the tokens per second since the last
``train`` record."""

from __future__ import annotations

import time

ESTIMATE_AFTER_STEPS = 3  # steps after the first that the duration estimate waits for ...
ESTIMATE_AFTER_S = 20.0  # ... or this many seconds, whichever comes first


class StepClock:
    """Times the steps of a run that starts at step ``step``; ``tokens_per_step`` is the global
    batch's tokens. Call `start` before a step and `done` after it."""

    def __init__(self, step: int, tokens_per_step: int) -> None:
        self.first_step, self.tokens_per_step = step, tokens_per_step
        self.started = self.now = self.window_t = time.perf_counter()
        self.first_done: float | None = None
        self.estimated = False
        self.window_tokens = 0

    def start(self) -> None:
        self.started = time.perf_counter()

    def done(self, step: int) -> tuple[str | None, float]:
        """After the step that reached ``step``: ``("first", its seconds)`` for the run's first
        step; ``("estimate", seconds per step)`` once, when `ESTIMATE_AFTER_STEPS` steps followed
        it or `ESTIMATE_AFTER_S` seconds passed since; else ``(None, 0.0)``."""
        self.now = time.perf_counter()
        self.window_tokens += self.tokens_per_step
        if self.first_done is None:
            self.first_done = self.now
            return "first", self.now - self.started
        after = step - self.first_step - 1  # steps since the first
        if not self.estimated and (after >= ESTIMATE_AFTER_STEPS
                                   or self.now - self.first_done >= ESTIMATE_AFTER_S):
            self.estimated = True
            return "estimate", (self.now - self.first_done) / after
        return None, 0.0

    def tokens_per_s(self) -> float:
        """Tokens per second since the last `reset_window` (the last ``train`` record)."""
        return self.window_tokens / max(self.now - self.window_t, 1e-9)

    def reset_window(self) -> None:
        self.window_t, self.window_tokens = self.now, 0
