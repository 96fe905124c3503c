"""``core:decay``: data-dependent scalar retention (MIRAS' L2 retention, Titans' forgetting gate).

``M_t = alpha_t M_{t-1} - ...`` with the gate ``alpha: [B, T, H]`` in [0, 1] (1 keeps the whole
memory). Titans writes ``(1 - alpha)`` for the same quantity; this project stores the retain factor.
"""

from __future__ import annotations

import torch

from ..knobs.gates import ALPHA
from ..knobs.retention import Retention


class DecayRetention(Retention):
    gates = (ALPHA,)

    def alpha(self, gates: dict, like: torch.Tensor) -> torch.Tensor:
        return gates["alpha"]


def build(params, ctx) -> DecayRetention:
    return DecayRetention()
