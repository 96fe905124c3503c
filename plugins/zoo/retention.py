"""``zoo:fixed_decay``: RetNet's fixed per-head retention (Sun et al. 2023, "Retentive Network").

Head h keeps ``alpha_h = 1 - 2^(-5 - h)`` of its memory at every token (no gate): the first head
forgets fastest (1 - 1/32), the last slowest. ``M_t = alpha_h M_{t-1} + ...``; a linear
retention, so every strategy that runs scalar decay runs it.
"""

from __future__ import annotations

import torch

from atlas_core.knobs.retention import Retention


class FixedDecay(Retention):
    gates = ()  # input-independent: no gate
    fixed_alpha = True  # but alpha is not 1

    def alpha(self, gates: dict, like: torch.Tensor) -> torch.Tensor:
        H = like.shape[-1]
        h = torch.arange(H, dtype=like.dtype, device=like.device)
        return like * (1.0 - torch.pow(2.0, -5.0 - h))  # [B, T, H]


def build(params, ctx) -> FixedDecay:
    return FixedDecay()


class DecayFirst(Retention):
    """``zoo:decay_first``: Gated DeltaNet's forgetting (Yang et al. 2024). The memory is decayed
    by the gate ``alpha_t`` first and the step is taken from the decayed memory, so the gradient
    is ``grad L_t(alpha_t M_{t-1})`` — another rule than ``core:decay``, whose gradient is taken
    at ``M_{t-1}`` (docs/math.md, reduction 6): ``M_t = alpha_t M_{t-1} - theta_t (alpha_t
    M_{t-1} k_t - v_t) k_t^T`` with gd and the l2 bias."""

    from atlas_core.knobs.gates import ALPHA as _ALPHA

    gates = (_ALPHA,)
    gradient_at = "retained"

    def alpha(self, gates: dict, like: torch.Tensor) -> torch.Tensor:
        return gates["alpha"]


def build_decay_first(params, ctx) -> DecayFirst:
    return DecayFirst()
