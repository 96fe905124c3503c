"""``core:exact_chunk``: the delta rule with decay, exact for any chunk size (WY / UT transform).

For ``gd`` on a linear memory with the l2 bias and a window of one token (Titans without momentum,
DeltaNet, their decayed variants) every step is an affine map of the memory:

    M_t = alpha_t M_{t-1} - theta_t (M_{t-1} k_t - v_t) k_t^T
        = M_{t-1} (alpha_t I - theta_t k_t k_t^T) + theta_t v_t k_t^T          (k = phi(k))

The gradient is taken at ``M_{t-1}`` (MATH.md reduction 6: Gated DeltaNet takes it at the decayed
``alpha_t M_{t-1}``; with decay those are different rules). Inside a chunk starting from ``S`` write
``A_t = prod_{m<=t} alpha_m``, ``L[t, i] = prod_{i<m<=t} alpha_m`` (`decay.decay_matrix`) and
``e_t = M_{t-1} k_t - v_t`` for the error at the TRUE memory (not an anchor). Unrolling gd gives

    M_t = A_t S - sum_{i<=t} L[t, i] theta_i e_i k_i^T,

so the errors satisfy a unit lower-triangular C x C system (``L'[t, i] = L[t-1, i]`` for i < t):

    e_t + sum_{i<t} L'[t, i] theta_i (k_t . k_i) e_i = A_{t-1} S k_t - v_t
    (I + N) E = A' K S^T - V   =>   E = W S^T - U,  W = (I + N)^{-1} A' K,  U = (I + N)^{-1} V

(the "UT transform": the unit lower-triangular matrix ``I + N`` does not depend on S). With
``P = L o (Q K^T) diag(theta)`` (``L'`` for ``read = "before"``):

    y      = A Q S^T - P E
    S_next = A_C S - E^T diag(L[C, :] theta) K

Everything that does not involve S (decay matrices, ``N``, ``P``, the scaled keys, and the UT
transforms ``W, U`` themselves: one batched triangular solve) is formed for all chunks at once; the
loop over chunks then does two products per chunk, the errors ``E = W S^T - U`` and the rank-C
update of S; the reads ``y = A Q S^T - P E`` of all chunks are batched after it. Only the memory
at chunk boundaries is kept. Cost O(T C d + T d^2), memory O(T C + T d + (T / C) d^2). The result
equals ``core:sequential`` up to rounding for every C (there is no anchoring approximation);
autograd differentiates through the solve. Per token this is about 4 C d + 3 d^2 multiply-adds
against 2 C d + 3 d^2 for ``core:chunkwise`` on the same rule (the Gram matrix ``K K^T`` and the
solve are the price of exactness): on a CPU, where time follows the multiply-adds, it runs about
1.5x slower than the anchored form at the same C (docs/benchmarks.md).

An Omega window of one token (``omega:window`` with ``window = 1`` around ``core:l2``) is supported
too: its weight ``gamma_t * lag[0]`` multiplies theta_t. Refused (``supports``): momentum or any
other algorithm, the dot / lp / huber biases, windows longer than one token, nonlinear retention,
deep memory. Tensors: ``p.psi, p.phik: [B, H, T, Dphi]``, ``p.v: [B, H, T, Dv]``, gates
``[B, H, T]``, state ``{"M": [B, H, Dv, Dphi]}``.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from einops import rearrange
from pydantic import Field

from ..host.registry import Params
from ..knobs.retention import Retention
from .base import Strategy
from .decay import decay_matrix


class ExactChunkParams(Params):
    chunk_size: int = Field(64, ge=1, description="tokens per chunk (C); the result is exact for any C")


def _is_l2(bias) -> bool:
    """The bias's error is ``pred - v`` (core:l2, or a one-token window around it)."""
    from ..components.l2 import L2Bias

    if bias is None:
        return False
    if type(bias).error is L2Bias.error:
        return True
    inner = getattr(bias, "inner", None)
    return inner is not None and getattr(bias, "window", 1) == 1 and _is_l2(inner)


def _shift_down(x: torch.Tensor, first: torch.Tensor, dim: int) -> torch.Tensor:
    """Drop the last entry along ``dim`` and put ``first`` in front (index t holds x[t - 1])."""
    return torch.cat([first, x.narrow(dim, 0, x.shape[dim] - 1)], dim=dim)


class ExactChunk(Strategy):
    name = "core:exact_chunk"

    def __init__(self, params: ExactChunkParams | None = None) -> None:
        self.params = params or ExactChunkParams()
        self.chunk_size = self.params.chunk_size

    def describe(self) -> str:
        return f"{self.name}(chunk_size={self.chunk_size})"

    def supports(self, rule) -> tuple[bool, str]:
        for attr in ("structure", "bias", "retention", "algorithm"):
            if not hasattr(rule, attr):
                return False, "core:exact_chunk runs knob-composed rules; this rule is standalone"
        spec = getattr(rule, "spec", {})
        if not (rule.structure.is_linear and set(rule.structure.weight_shapes()) == {"M"}):
            return False, (
                f"structure {spec.get('structure')!r} is not a linear matrix memory; the WY form "
                "needs M_t = M_{t-1} (alpha I - theta k k^T) + ... (use core:chunkwise)"
            )
        if getattr(rule.algorithm, "linear_form", None) != "gd":
            return False, (
                f"algorithm {spec.get('algorithm')!r} is not core:gd: momentum adds a second state "
                "(Z), so one step is no longer a rank-1 update of M (use core:chunkwise)"
            )
        if int(getattr(rule.bias, "window", 1)) != 1:
            return False, (
                f"bias {spec.get('bias')!r} has a window of {rule.bias.window} tokens: the "
                "transition becomes rank c, not rank 1 (use core:chunkwise)"
            )
        if not _is_l2(rule.bias):
            return False, (
                f"bias {spec.get('bias')!r} is not the l2 (delta-rule) bias: the exact form needs "
                "an error linear in the memory, M k - v (use core:chunkwise)"
            )
        ret = rule.retention
        if not ret.linear or type(ret).pre is not Retention.pre or type(ret).post is not Retention.post:
            return False, f"retention {spec.get('retention')!r} is not a scalar decay"
        return True, ""

    def run(self, rule, p):
        B, H, T = p.shape
        C = self.chunk_size
        S = p.state["M"]  # [B, H, Dv, Dk]
        lag0 = rule.bias.lag_weights(p.v.dtype, p.v.device)[0]
        theta = p.gates["theta"] * p.gamma * lag0  # the step size of token t, [B, H, T]
        if T == 0:
            return p.v.new_zeros(B, H, 0, p.v.shape[-1]), rule._final_state({"M": S}, {}, p.phik, p.v, p.gamma)
        # pad to whole chunks: a token with k = 0, theta = 0, alpha = 1 leaves the memory unchanged
        pad = (-T) % C
        K, Q, V, alpha = p.phik, p.psi, p.v, p.alpha
        if pad:
            K, Q, V = (F.pad(x, (0, 0, 0, pad)) for x in (K, Q, V))
            theta = F.pad(theta, (0, pad))
            alpha = F.pad(alpha, (0, pad), value=1.0)
        K, Q, V = (rearrange(x, "b h (n c) d -> b h n c d", c=C) for x in (K, Q, V))
        theta, alpha = (rearrange(x, "b h (n c) -> b h n c", c=C) for x in (theta, alpha))

        after = rule.read == "after"
        # everything that does not depend on the memory, for all chunks at once
        L = decay_matrix(alpha)  # [B, H, N, C, C]: L[t, i] = prod_{i<m<=t} alpha_m
        Lp = _shift_down(L, torch.zeros_like(L[..., :1, :]), dim=-2)  # L[t-1, i], strictly lower
        A = torch.cumprod(alpha, dim=-1)  # A_t
        Ap = _shift_down(A, torch.ones_like(A[..., :1]), dim=-1)  # A_{t-1}
        KtT = (theta.unsqueeze(-1) * K).transpose(-1, -2)  # (diag(theta) K)^T: [B, H, N, Dk, C]
        Nm = Lp * (K @ KtT)  # strictly lower: the system is (I + Nm) E = ...
        P = (L if after else Lp) * (Q @ KtT)  # intra-chunk read weights
        Ks = Ap.unsqueeze(-1) * K  # A_{t-1} k_t
        Qs = (A if after else Ap).unsqueeze(-1) * Q
        Kd = L[..., -1, :].unsqueeze(-2) * KtT  # L[C, i] theta_i k_i, as columns: [B, H, N, Dk, C]
        AC = A[..., -1, None, None]  # A_C: [B, H, N, 1, 1]
        # the UT transform of every chunk at once: W = (I + Nm)^-1 A' K, U = (I + Nm)^-1 V
        WU = torch.linalg.solve_triangular(Nm, torch.cat([Ks, V], dim=-1), upper=False, unitriangular=True)
        Wt, Ut = WU.split([K.shape[-1], V.shape[-1]], dim=-1)
        KdT = Kd.transpose(-1, -2).contiguous()  # [B, H, N, C, Dk]
        # chunk after chunk, only what involves the memory: the errors E = W S^T - U and the next
        # boundary memory S' = A_C S - (Kd E)^T, two products per chunk (unbind, not indexing,
        # keeps the backward one op per tensor); the reads of every chunk afterwards, batched
        starts, errors = [], []
        for Wn, Un, KdTn, ACn in zip(Wt.unbind(2), Ut.unbind(2), KdT.unbind(2), AC.unbind(2)):
            starts.append(S)
            E = torch.baddbmm(Un.flatten(0, 1), Wn.flatten(0, 1), S.flatten(0, 1).transpose(-1, -2), beta=-1)
            errors.append(E)
            S = torch.baddbmm((ACn * S).flatten(0, 1), E.transpose(-1, -2), KdTn.flatten(0, 1), alpha=-1)
            S = S.view(ACn.shape[:2] + S.shape[1:])
        S0 = torch.stack(starts, dim=2)  # [B, H, N, Dv, Dk]: the memory before each chunk
        E = torch.stack(errors, dim=1).view(Ut.shape)  # [B, H, N, C, Dv]
        y = Qs @ S0.transpose(-1, -2) - P @ E
        y = rearrange(y, "b h n c d -> b h (n c) d")[:, :, :T]
        return y, rule._final_state({"M": S}, {}, p.phik, p.v, p.gamma)


def build(params, ctx) -> ExactChunk:
    return ExactChunk(params)
