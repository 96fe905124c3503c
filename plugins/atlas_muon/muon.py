"""``atlas_muon:muon``: momentum orthogonalised by Newton–Schulz (Atlas Eq 32-33, docs/math.md knob 4).

With ``g_t = grad L_t(M_{t-1})`` and ``Z_0 = 0``::

    Z_t = eta_t Z_{t-1} + g_t
    M_t = alpha_t M_{t-1} - theta_t NS_k(Z_t)

(the descent form of Atlas Eq 32-33; ``theta`` multiplies after NS because NS erases the
magnitude, so a learning rate inside the momentum would be lost). Every weight of the memory has
its own momentum, stored as ``"Z.<weight name>"`` (as ``core:momentum`` does), and NS acts on each
weight matrix separately: ``M: [B, H, Dv, Dphi]`` for ``core:linear``, ``W1, W2, ...`` for
``titans:mlp``. A memory whose weights are not all matrices cannot use Muon (`check_composition`).

``ns_steps = 0`` performs no orthogonalisation: ``NS_0(Z) = Z / (||Z||_F + eps)``, a normalised
momentum step. (It is not Titans' momentum: for that use ``core:momentum``.)

Chunk form (used by ``core:chunkwise`` and ``atlas_muon:atlas_parallel``): inside a chunk of C
tokens every gradient is taken at the anchor, so ``g_t`` does not depend on the memory and both
recurrences are linear scans (Atlas Eq 34, "state-independent momentum"). With the decay matrices
``E[t, i] = prod_{i<m<=t} eta_m`` and ``L[t, j] = prod_{j<m<=t} alpha_m`` (the closed form of the
scans, `atlas_core.forms.decay.decay_matrix`), ``P_t = prod_{m<=t} eta_m`` and
``A_t = prod_{m<=t} alpha_m``::

    Z_t = P_t Z_0 + sum_{i<=t} E[t, i] g_i                      [B, H, C, *s]
    N_t = NS_k(Z_t)                                            one batched call over (B, H, C)
    M_t = A_t M_0 - sum_{j<=t} L[t, j] theta_j N_j             [B, H, C, *s]

so the transient memory is O(C |W|) per chunk; the whole sequence is never materialised.

Gates: ``eta, theta`` (and the retention's ``alpha``), ``[B, H]`` in `step`, ``[B, H, C]`` in
`chunk`.
"""

from __future__ import annotations

from typing import Sequence

import torch

from atlas_core.knobs.algorithm import Algorithm, broadcast_gate
from atlas_core.knobs.gates import ETA, THETA
from atlas_core.forms.decay import decay_matrix

from .newton_schulz import DEFAULT_COEFFICIENTS, DEFAULT_EPS, DEFAULT_STEPS, check_ns_args, newton_schulz


class Muon(Algorithm):
    """Muon inner optimiser (see module docstring)."""

    gates = (ETA, THETA)
    # NS is nonlinear in Z: the linear-memory "attention" fast path of core:chunkwise does not
    # apply; the chunk runs the generic per-token path.
    linear_form = None

    def __init__(
        self,
        ns_steps: int = DEFAULT_STEPS,
        coefficients: Sequence[float] = DEFAULT_COEFFICIENTS,
        eps: float = DEFAULT_EPS,
    ) -> None:
        self.coefficients = check_ns_args(ns_steps, coefficients, eps)
        self.ns_steps = ns_steps
        self.eps = eps

    def __repr__(self) -> str:
        return f"Muon(ns_steps={self.ns_steps}, coefficients={self.coefficients})"

    # -- composition ----------------------------------------------------------------------------
    def check_composition(self, rule) -> list[str]:
        """Muon orthogonalises each weight matrix: every weight must be a matrix."""
        structure = rule.structure
        if not structure.matrix_shaped:
            name = rule.spec.get("structure", type(structure).__name__)
            return [
                f"atlas_muon:muon orthogonalises every memory weight as a matrix, but structure "
                f"{name!r} has weights that are not matrices (matrix_shaped = False); use a "
                "matrix-shaped memory (core:linear, titans:mlp) or another algorithm (core:momentum)"
            ]
        return []

    # -- the pieces -----------------------------------------------------------------------------
    def ns(self, Z: torch.Tensor) -> torch.Tensor:
        """``NS_k`` on every trailing matrix of ``Z: [..., r, c]``."""
        return newton_schulz(Z, self.ns_steps, self.coefficients, self.eps)

    @staticmethod
    def _check_matrix(name: str, w: torch.Tensor, lead: int) -> None:
        # lead = 2 for [B, H, r, c] (step), 3 for [B, H, C, r, c] (chunk)
        if w.dim() != lead + 2:
            raise ValueError(
                f"atlas_muon:muon needs matrix weights, but weight {name!r} has shape "
                f"{tuple(w.shape)} (expected {lead} leading axes and a matrix)"
            )

    def init_opt(self, W: dict) -> dict:
        return {f"Z.{k}": torch.zeros_like(w) for k, w in W.items()}

    # -- one token (core:sequential) ------------------------------------------------------------
    def step(self, W, opt, g, *, alpha, gates, retention):
        eta, theta = gates["eta"], gates["theta"]  # [B, H]
        Z = {}
        for k, gk in g.items():
            self._check_matrix(k, gk, 2)
            z0 = opt[f"Z.{k}"]
            Z[k] = broadcast_gate(eta, z0) * z0 + gk  # [B, H, r, c]
        pre = retention.pre(W)
        raw = {k: broadcast_gate(alpha, pre[k]) * pre[k] - broadcast_gate(theta, Z[k]) * self.ns(Z[k])
               for k in W}
        return retention.post(raw), {f"Z.{k}": z for k, z in Z.items()}

    # -- a chunk of anchored gradients (core:chunkwise, atlas_muon:atlas_parallel) ---------------
    def momenta(self, Z0: torch.Tensor, G: torch.Tensor, eta: torch.Tensor) -> torch.Tensor:
        """The momentum scan ``Z_t = eta_t Z_{t-1} + G_t`` over a chunk, in closed form.

        ``Z0: [B, H, *s]``, ``G: [B, H, C, *s]``, ``eta: [B, H, C]`` -> ``Z: [B, H, C, *s]``."""
        E = decay_matrix(eta)  # [B, H, C, C]
        P = torch.cumprod(eta, dim=-1)  # [B, H, C]
        return broadcast_gate(P, G) * Z0.unsqueeze(2) + torch.einsum("bhti,bhi...->bht...", E, G)

    def chunk(self, W0, opt0, G, *, decay, decay_from_start, gates):
        eta, theta, A = gates["eta"], gates["theta"], decay_from_start  # [B, H, C]
        out, opt = {}, {}
        for k, w0 in W0.items():
            self._check_matrix(k, G[k], 3)
            Z = self.momenta(opt0[f"Z.{k}"], G[k], eta)  # [B, H, C, r, c]
            N = self.ns(Z)  # every Z_t of the chunk in one batched call
            upd = torch.einsum("bhtj,bhj...->bht...", decay, broadcast_gate(theta, N) * N)  # [B, H, C, r, c]
            out[k] = broadcast_gate(A, upd) * w0.unsqueeze(2) - upd
            opt[f"Z.{k}"] = Z[:, :, -1]
        return out, opt


    def chunk_factors(self, W0, opt0, fac, Wm, *, decay, decay_from_start, gates):
        """`chunk` with the anchored gradients given as rank-one factors (a structure with
        ``rank_one_grads``): position l of the window-extended chunk contributes
        ``delta_l z_l^T`` to each weight's gradient (``fac[k] = (delta [B, H, m, out],
        z [B, H, m, in])``) and token t's gradient is ``G_t = sum_l Wm[t, l] delta_l z_l^T``.
        The same result as `chunk` on those G, without forming them: with ``K = E Wm``
        (``[B, H, C, m]``)::

            Z_t = P_t Z_0 + sum_l K[t, l] delta_l z_l^T     one product [C, out, m] x [m, in]
            M_t = A_t M_0 - sum_j L[t, j] theta_j N_j       one product [C, C + 1] x [C + 1, |W|]

        (the second with ``M_0`` as an extra column of the coefficient matrix)."""
        eta, theta, A = gates["eta"], gates["theta"], decay_from_start  # [B, H, C]
        K = decay_matrix(eta) @ Wm  # [B, H, C, m]
        P = torch.cumprod(eta, dim=-1)
        # [-L diag(theta) | A]: the coefficients of N_1 .. N_C and of M_0 in every M_t
        coef = torch.cat([-decay * theta.unsqueeze(-2), A.unsqueeze(-1)], dim=-1)  # [B, H, C, C + 1]
        out, opt = {}, {}
        for k, w0 in W0.items():
            delta, z = fac[k]
            self._check_matrix(k, w0, 2)
            D = (K.unsqueeze(-1) * delta.unsqueeze(2)).transpose(-1, -2)  # [B, H, C, out, m]
            Z = torch.addcmul(D @ z.unsqueeze(2), broadcast_gate(P, D), opt0[f"Z.{k}"].unsqueeze(2))
            N = self.ns(Z)  # [B, H, C, out, in]
            NW = torch.cat([N, w0.unsqueeze(2)], dim=2).flatten(3)  # [B, H, C + 1, |W|]
            out[k] = (coef @ NW).unflatten(-1, w0.shape[-2:])
            opt[f"Z.{k}"] = Z[:, :, -1]
        return out, opt


def build(params, ctx) -> Muon:
    if params is None:
        return Muon()
    return Muon(ns_steps=params.ns_steps, coefficients=params.coefficients)
