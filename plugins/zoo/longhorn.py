"""``zoo:normalized_l2``: Longhorn's implicit online-regression step (Liu et al. 2024, "Longhorn:
State Space Models are Amortized Online Learners"); NLMS has the same form.

The delta rule whose step is normalised by the key and the gate together::

    eps_t = theta_t / (1 + theta_t |k_t|^2)
    M_t   = M_{t-1} - eps_t (M_{t-1} k_t - v_t) k_t^T = M_{t-1} (I - eps_t k_t k_t^T) + eps_t v_t k_t^T

(k the feature-mapped key). Written as the l2 bias with the per-token weight
``gamma_t = 1 / (1 + theta_t |k_t|^2)``: with ``core:gd`` the step is ``theta_t gamma_t = eps_t``.
The bias declares ``weight_reads_key`` (it is handed the key) and the gate ``theta`` it shares
with the algorithm. Every strategy multiplies each token's error by the bias's weight, so every
strategy that runs the delta rule runs this one (``core:exact_chunk`` exactly, at any chunk).
"""

from __future__ import annotations

import torch

from atlas_core.components.l2 import L2Bias
from atlas_core.knobs.gates import THETA


class NormalizedL2(L2Bias):
    """``1/2 ||M k - v||^2`` weighted by ``1 / (1 + theta_t |k_t|^2)``."""

    gates = (THETA,)
    weight_reads_key = True
    error_kind = "l2"  # the error is still pred - v; only its per-token weight changes

    def weight(self, gates: dict, like: torch.Tensor, key: torch.Tensor | None = None) -> torch.Tensor:
        # gates["theta"]: [B, T, H]; key: [B, T, H, Dphi] -> [B, T, H]
        return 1.0 / (1.0 + gates["theta"] * key.pow(2).sum(-1))

    def describe(self) -> str:
        return "l2 weighted by 1 / (1 + theta |k|^2) (Longhorn)"


def build(params, ctx) -> NormalizedL2:
    return NormalizedL2()
