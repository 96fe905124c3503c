"""Retention: how much of the old memory a step keeps (docs/math.md, knob 3).

A step computes ``raw = alpha_t * pre(M_{t-1}) + delta_t`` and ``M_t = post(raw)``, where delta is
the algorithm's update. Linear retentions (``core:none``, ``core:decay``) use identity pre/post and
are what the chunkwise forms need; nonlinear ones (e.g. a softmax/KL retention) override
`pre`/`post` and set ``linear = False``.
"""

from __future__ import annotations

import torch

from .gates import Gate


class Retention:
    """Base class of retentions."""

    linear: bool = True
    #: The gates `alpha` reads (docs/plugins.md#gates); ``gate_names`` follows. A retention
    #: without gates retains everything (alpha = 1; `alpha` is not called) unless it declares
    #: ``fixed_alpha``.
    gates: tuple[Gate, ...] = ()
    #: `alpha` gives a retain factor that reads no gate (e.g. RetNet's fixed per-head decay):
    #: it is called although the retention declares no gates.
    fixed_alpha: bool = False
    #: Where the algorithm's gradient is taken: ``"current"`` (at ``M_{t-1}``, Titans, MIRAS) or
    #: ``"retained"`` (at ``alpha_t M_{t-1}``, Gated DeltaNet: the memory is decayed first, then
    #: the step is taken from it; docs/math.md reduction 6). A retained point needs ``anchor = 1``.
    gradient_at: str = "current"

    @property
    def gate_names(self) -> tuple[str, ...]:
        return tuple(g.name for g in self.gates)

    def alpha(self, gates: dict, like: torch.Tensor) -> torch.Tensor:
        """The retain factor per token ``[B, T, H]`` (1 keeps everything), from the call's
        ``gates`` (name -> ``[B, T, H]``, or ``[B, T, H, Dk]`` for a key gate); ``like`` is a
        ``[B, T, H]`` tensor of ones in the compute dtype."""
        return torch.ones_like(like)

    def start(self, W: dict) -> dict:
        """The memory before the first token, from the structure's initial state ``W``: the
        identity, except for a retention whose memory lives on a constraint set (the KL
        retention's simplex), which returns a point of that set."""
        return W

    def pre(self, W: dict) -> dict:
        return W

    def post(self, W: dict) -> dict:
        return W

    def check_composition(self, rule) -> list[str]:
        """Problems with the composition this knob is placed in (a list of messages; empty
        when it fits). Called once, when the rule is built."""
        return []
