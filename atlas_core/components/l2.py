"""``core:l2``: the delta-rule attentional bias ``l(M) = 1/2 ||M(phi(k)) - v||^2``.

Derivative w.r.t. the prediction: ``e = M(phi(k)) - v``; for linear memory the gradient is
``e phi(k)^T`` (docs/math.md, knob 2).
"""

from __future__ import annotations

import torch

from ..knobs.bias import Bias


class L2Bias(Bias):
    error_kind = "l2"

    def error(self, pred: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        return pred - v

    def loss(self, pred: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        return 0.5 * (pred - v).pow(2).sum(-1)


def build(params, ctx) -> L2Bias:
    return L2Bias()
