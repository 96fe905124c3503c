"""``acme_gate:beta_l2``: the delta-rule loss of token t weighted by a per-head gate beta_t,

    l_t(M) = beta_t / 2 ||M(phi(k_t)) - v_t||^2,       beta_t = sigmoid(w_b x_t + b_b) in (0, 1).

The gate is declared (``gates``), so the memory layer learns a projection for it and the rule asks
for ``gates["beta"]: [B, T, H]``; `weight` hands it to the strategies as the token's loss weight.
The error itself is the l2 one (``error_kind = "l2"``), so the fast l2 paths serve it.
"""

from __future__ import annotations

import torch

from atlas_core.knobs import Bias, Gate

BETA = Gate("beta", shape="head", activation="sigmoid", bias=0.0, range=(0.0, 1.0),
            summary="per-head weight of the token's loss: sigmoid(0) = 0.5")


class BetaL2(Bias):
    gates = (BETA,)
    error_kind = "l2"

    def weight(self, gates, like):  # gates["beta"]: [B, T, H]
        return gates["beta"]

    def error(self, pred: torch.Tensor, v: torch.Tensor) -> torch.Tensor:  # [..., Dv]
        return pred - v

    def loss(self, pred: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        return 0.5 * (pred - v).pow(2).sum(-1)


def build(params, ctx) -> BetaL2:
    return BetaL2()
