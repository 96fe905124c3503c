"""``core:momentum``: Titans' momentum (Titans Eq 13-14).

``Z_t = eta_t Z_{t-1} + theta_t g_t``;  ``M_t = alpha_t M_{t-1} - Z_t``;  ``Z_0 = 0``.
Titans calls eta the surprise decay. With eta = 0 this is ``core:gd``.

Chunk form: with ``E[t, i] = prod_{i<m<=t} eta_m`` and ``P_t = prod_{m<=t} eta_m``,
``Z_t = P_t Z_0 + sum_i E[t, i] theta_i g_i`` and ``M_t = A_t M_0 - sum_j L[t, j] Z_j``.
The optimiser state is stored as ``"Z.<weight name>"``.
"""

from __future__ import annotations

import torch

from ..knobs.algorithm import Algorithm, broadcast_gate
from ..knobs.gates import ETA, THETA
from ..forms.decay import decay_matrix


class Momentum(Algorithm):
    gates = (ETA, THETA)
    linear_form = "momentum"

    def init_opt(self, W: dict) -> dict:
        return {f"Z.{k}": torch.zeros_like(w) for k, w in W.items()}

    def step(self, W, opt, g, *, alpha, gates, retention):
        eta, theta = gates["eta"], gates["theta"]
        Z = {k: broadcast_gate(eta, opt[f"Z.{k}"]) * opt[f"Z.{k}"] + broadcast_gate(theta, g[k]) * g[k] for k in W}
        pre = retention.pre(W)
        raw = {k: broadcast_gate(alpha, pre[k]) * pre[k] - Z[k] for k in W}
        return retention.post(raw), {f"Z.{k}": z for k, z in Z.items()}

    def chunk(self, W0, opt0, G, *, decay, decay_from_start, gates):
        eta, theta, A = gates["eta"], gates["theta"], decay_from_start
        E = decay_matrix(eta)  # [B, H, C, C]
        P = torch.cumprod(eta, dim=-1)  # [B, H, C]
        out, opt = {}, {}
        for k, w0 in W0.items():
            z0 = opt0[f"Z.{k}"]
            Z = broadcast_gate(P, G[k]) * z0.unsqueeze(2) + torch.einsum(
                "bhti,bhi...->bht...", E, broadcast_gate(theta, G[k]) * G[k]
            )  # [B, H, C, *s]
            upd = torch.einsum("bhtj,bhj...->bht...", decay, Z)
            out[k] = broadcast_gate(A, upd) * w0.unsqueeze(2) - upd
            opt[f"Z.{k}"] = Z[:, :, -1]
        return out, opt


def build(params, ctx) -> Momentum:
    return Momentum()
