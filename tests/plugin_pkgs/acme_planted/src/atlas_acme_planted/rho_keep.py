"""``planted:rho_keep``: a linear retention with its own gate, ``alpha_t = 1 - rho_t^2``.

``rho: [B, T, H]`` in [0, 1] (sigmoid, initial bias -2: rho ~ 0.12, alpha ~ 0.986). Planted bug
``gate_edge_nan``: the same value as ``exp(log1p(-rho^2))``, whose gradient is ``0 * -inf = NaN``
at rho = 1 (and only there).
"""

from __future__ import annotations

import torch

from atlas_core.knobs import Gate, Retention

from .bugs import planted

RHO = Gate("rho", shape="head", activation="sigmoid", bias=-2.0, range=(0.0, 1.0),
           summary="forget strength: alpha = 1 - rho^2")


class RhoKeep(Retention):
    gates = (RHO,)

    def alpha(self, gates, like):  # gates["rho"]: [B, T, H] -> [B, T, H]
        rho = gates["rho"]
        if planted("gate_edge_nan"):
            return torch.exp(torch.log1p(-rho * rho))
        return 1.0 - rho * rho


def build(params, ctx) -> RhoKeep:
    return RhoKeep()
