"""``miras:lq``: Moneta's lq retention, a normalisation of the accumulated update
(MIRAS, Behrouz et al. 2025, Eq 24).

MIRAS writes Moneta's recurrence with an accumulator A and the memory M it normalises::

    A_t = alpha_t A_{t-1} - theta_t g_t          g_t = grad l_p(M_{t-1}; k_t, v_t)
    M_t = A_t / ||A_t||_q^(q - 2)

``||.||_q`` is the entrywise q-norm of each weight tensor, per (batch, head). The rule's state is
the memory M (it is what is read), so the retention's hooks (`atlas_core.knobs.Retention`) invert
the normalisation to recover A before the update and apply it after:

    post(A) = A * ||A||_q^-(q-2)                 (A -> M, the paper's normalisation)
    pre(M)  = M * ||M||_q^((q-2)/(3-q))          (M -> A: ||M|| = ||A||^(3-q), so ||A|| = ||M||^(1/(3-q)))

which is exact for every q != 3 (at q = 3 the map forgets the magnitude and cannot be inverted).
At q = 2 both hooks are the identity and the retention is ``core:decay`` (``linear = True``, the
declared reduction ``q2_is_decay``); otherwise it is nonlinear: ``core:chunkwise`` runs it in
chunks inside anchor blocks (the ``stepped_chunk`` form: gradients at the anchor formed at once,
the normalisation applied token by token between them, exact) and refuses a chunk size above 1
at ``anchor = 1``. (MIRAS applies the normalisation once per chunk in its parallel form, which is
a different rule.)
For q > 3 the normalisation inverts magnitudes (a large A gives a small M); with a linear memory
q in (2, 3) keeps the memory's scale closest to the accumulator's.

A zero tensor (the empty memory) maps to zero both ways; its norm is replaced by 1 before the
power so that neither the value nor the gradient becomes NaN.

Shapes: every weight ``[B, H, *shape]`` (``"M": [B, H, Dv, Dphi]`` for ``core:linear``).
"""

from __future__ import annotations

import torch
from pydantic import Field, field_validator

from atlas_core.params import Params
from atlas_core.knobs import Retention
from atlas_core.knobs.gates import ALPHA


class LqParams(Params):
    q: float = Field(4.0, gt=1.0, le=8.0, description="the norm's exponent; 2 is plain decay; 3 is not invertible")

    @field_validator("q")
    @classmethod
    def _not_three(cls, q: float) -> float:
        if abs(q - 3.0) < 1e-6:
            raise ValueError("q=3 normalises every memory to unit norm, which cannot be inverted; use q != 3")
        return q


def _qnorm(W: torch.Tensor, q: float) -> torch.Tensor:
    """Entrywise q-norm per (batch, head), shaped to broadcast against W; 1 where W is zero."""
    flat = W.flatten(2)
    zero = (flat == 0).all(dim=-1, keepdim=True)
    safe = torch.where(zero, torch.ones_like(flat), flat)  # keeps the norm's gradient finite at 0
    n = safe.abs().pow(q).sum(-1, keepdim=True).pow(1.0 / q)
    n = torch.where(zero, torch.ones_like(n), n)
    return n.reshape(n.shape[:2] + (1,) * (W.dim() - 2))


class LqRetention(Retention):
    gates = (ALPHA,)

    def __init__(self, q: float = 4.0) -> None:
        self.q = float(q)
        self.linear = self.q == 2.0

    def alpha(self, gates: dict, like: torch.Tensor) -> torch.Tensor:
        return gates["alpha"]

    def pre(self, W: dict) -> dict:
        if self.linear:
            return W
        s = (self.q - 2.0) / (3.0 - self.q)
        return {k: w * _qnorm(w, self.q).pow(s) for k, w in W.items()}

    def post(self, W: dict) -> dict:
        if self.linear:
            return W
        return {k: a * _qnorm(a, self.q).pow(-(self.q - 2.0)) for k, a in W.items()}


def build(params: LqParams | None, ctx) -> LqRetention:
    return LqRetention((params or LqParams()).q)
