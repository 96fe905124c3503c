"""``acme_nlms:nlms``: the normalised LMS step as a weighted l2 loss,

    l_t(M) = w_t / 2 ||M(phi(k_t)) - v_t||^2,   w_t = mu_t / (delta + |phi(k_t)|^2),

so with ``core:gd`` the step is ``eps_t = theta_t mu_t / (delta + |phi(k_t)|^2)`` (Longhorn's
``theta / (1 + theta |k|^2)`` has the same form). ``mu`` is a gate this package declares
(softplus, per head); the weight reads the feature-mapped key, which the bias asks for by
declaring ``weight_reads_key``. The error is the l2 one (``error_kind = "l2"``), so the exact l2
paths serve it.
"""

from __future__ import annotations

import torch
from pydantic import Field

from atlas_core.host.registry import Params
from atlas_core.knobs import Bias, Gate

MU = Gate("mu", shape="head", activation="softplus", bias=0.5, range=(0.0, None),
          summary="NLMS step size mu_t > 0: softplus(0.5) ~ 0.97")


class NLMSParams(Params):
    delta: float = Field(1.0, gt=0.0, description="regulariser of the key's squared norm")


class NLMS(Bias):
    gates = (MU,)
    weight_reads_key = True
    error_kind = "l2"

    def __init__(self, delta: float) -> None:
        self.delta = float(delta)

    def weight(self, gates, like, key=None):  # gates["mu"]: [B, T, H]; key: [B, T, H, Dphi]
        return gates["mu"] / (self.delta + key.pow(2).sum(-1))

    def error(self, pred: torch.Tensor, v: torch.Tensor) -> torch.Tensor:  # [B, H, N, Dv]
        return pred - v

    def loss(self, pred: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        return 0.5 * (pred - v).pow(2).sum(-1)


def build(params: NLMSParams, ctx) -> NLMS:
    return NLMS(params.delta)
