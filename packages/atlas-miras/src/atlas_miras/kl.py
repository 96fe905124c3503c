"""``miras:kl``: Memora's KL-divergence retention, a softmax (mirror-descent) update
(MIRAS, Behrouz et al. 2025, Eq 21 and 27).

With the KL divergence to the previous memory as retention and entropy regularisation, the
minimiser of one step is a softmax of the log-memory::

    M_t = c * softmax( alpha_t * log(M_{t-1} / c) - theta_t g_t )

so every row of M lies on the scaled simplex (non-negative, summing to c). ``alpha`` in [0, 1]
acts as a temperature on the old memory: alpha = 1 keeps it, alpha = 0 forgets it entirely (the
new memory is the softmax of the update alone). In the retention hooks of
`atlas_core.knobs.Retention`:

    pre(M)  = log(max(M / c, tiny))          post(raw) = c * softmax(raw)

``axis = "row"`` (default) normalises each row of each weight over its last axis (for
``core:linear``, each output coordinate is a convex combination of the key features, times c);
``"matrix"`` normalises the whole weight of each head. The paper leaves the slice open ("per
slice"); rows keep every output coordinate in use.

The memory starts on the simplex, at its centre: every entry ``c / n`` where ``n`` is the size of
the slice (``c / Dphi`` per row for ``core:linear`` with ``axis = "row"``; ``c / (Dv Dphi)`` with
``"matrix"``), the `start` hook. That is the paper's start: the first step's gradient is taken at
the uniform memory, and with ``read = "before"`` the first output reads it (``(c / Dphi) sum(phi(q))``
per output coordinate). A state with an entry exactly zero (a boundary point of the simplex) is
still accepted: its log is clamped at ``log(tiny)``, so the entry stays numerically zero while
``alpha > 0`` (alpha = 0 forgets the old memory, zeros included). The
retention is nonlinear (``linear = False``): ``core:chunkwise`` runs it in chunks inside anchor
blocks (the ``stepped_chunk`` form, exact: the softmax applied token by token between gradients
formed at the anchor at once), ``core:sequential`` runs every rule.

Shapes: every weight ``[B, H, *shape]`` (``"M": [B, H, Dv, Dphi]`` for ``core:linear``).
"""

from __future__ import annotations

from typing import Literal

import torch
from pydantic import Field

from atlas_core.params import Params
from atlas_core.knobs import Retention
from atlas_core.knobs.gates import ALPHA


class KLParams(Params):
    scale: float = Field(1.0, gt=0.0, description="c: each normalised slice sums to c")
    axis: Literal["row", "matrix"] = Field("row", description="normalise each row, or each whole weight")


class KLRetention(Retention):
    gates = (ALPHA,)
    linear = False

    def __init__(self, scale: float = 1.0, axis: str = "row") -> None:
        self.scale = float(scale)
        self.axis = axis

    def alpha(self, gates: dict, like: torch.Tensor) -> torch.Tensor:
        return gates["alpha"]

    def start(self, W: dict) -> dict:
        """The centre of the scaled simplex: every entry ``c / n``, n the size of a slice."""
        out = {}
        for k, w in W.items():
            n = w.shape[-1] if self.axis == "row" else w[0, 0].numel()
            out[k] = torch.full_like(w, self.scale / max(n, 1))
        return out

    def pre(self, W: dict) -> dict:
        out = {}
        for k, w in W.items():
            tiny = torch.finfo(w.dtype).tiny
            out[k] = torch.log((w / self.scale).clamp_min(tiny))
        return out

    def post(self, W: dict) -> dict:
        out = {}
        for k, raw in W.items():
            if self.axis == "row":
                out[k] = self.scale * torch.softmax(raw, dim=-1)
            else:
                flat = raw.flatten(2)
                out[k] = self.scale * torch.softmax(flat, dim=-1).reshape(raw.shape)
        return out


def build(params: KLParams | None, ctx) -> KLRetention:
    params = params or KLParams()
    return KLRetention(params.scale, params.axis)
