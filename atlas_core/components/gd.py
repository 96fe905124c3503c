"""``core:gd``: plain online gradient descent, ``M_t = alpha_t M_{t-1} - theta_t g_t``.

Chunk form (all g at the anchor, linear retention):
``M_t = A_t M_0 - sum_{j<=t} L[t, j] theta_j g_j`` with ``L[t, j] = prod_{j<m<=t} alpha_m``.
"""

from __future__ import annotations

import torch

from ..knobs.algorithm import Algorithm, broadcast_gate
from ..knobs.gates import THETA


class GD(Algorithm):
    gates = (THETA,)
    linear_form = "gd"

    def step(self, W, opt, g, *, alpha, gates, retention):
        theta = gates["theta"]
        pre = retention.pre(W)
        raw = {k: broadcast_gate(alpha, pre[k]) * pre[k] - broadcast_gate(theta, g[k]) * g[k]
               for k in W}
        return retention.post(raw), opt

    def chunk(self, W0, opt0, G, *, decay, decay_from_start, gates):
        theta, A = gates["theta"], decay_from_start  # [B, H, C]
        out = {}
        for k, w0 in W0.items():
            upd = torch.einsum("bhtj,bhj...->bht...", decay, broadcast_gate(theta, G[k]) * G[k])
            out[k] = broadcast_gate(A, upd) * w0.unsqueeze(2) - upd
        return out, opt0


def build(params, ctx) -> GD:
    return GD()
