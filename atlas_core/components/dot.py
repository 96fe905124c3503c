"""``core:dot``: the Hebbian attentional bias ``l(M) = -<M(phi(k)), v>``.

Derivative w.r.t. the prediction: ``-v``, independent of the memory; with linear memory, no
retention and theta = 1 the rule is linear attention ``M_t = M_{t-1} + v_t phi(k_t)^T``.
"""

from __future__ import annotations

import torch

from ..knobs.bias import Bias


class DotBias(Bias):
    prediction_free = True
    error_kind = "dot"

    def error(self, pred: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        return -v.expand_as(pred) if pred is not None else -v

    def loss(self, pred: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        return -(pred * v).sum(-1)


def build(params, ctx) -> DotBias:
    return DotBias()
