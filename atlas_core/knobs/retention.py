"""Retention: how much of the old memory a step keeps (docs/math.md, knob 3).

A step computes ``raw = alpha_t * pre(M_{t-1}) + delta_t`` and ``M_t = post(raw)``, where delta is
the algorithm's update. Linear retentions (``core:none``, ``core:decay``) use identity pre/post and
are what the chunkwise forms need; nonlinear ones (e.g. a softmax/KL retention) override
`pre`/`post` and set ``linear = False``.
"""

from __future__ import annotations

import torch


class Retention:
    """Base class of retentions."""

    linear: bool = True
    gate_names: tuple[str, ...] = ()

    def alpha(self, gates: dict, like: torch.Tensor) -> torch.Tensor:
        """The retain factor per token ``[B, T, H]`` (1 keeps everything)."""
        return torch.ones_like(like)

    def pre(self, W: dict) -> dict:
        return W

    def post(self, W: dict) -> dict:
        return W
