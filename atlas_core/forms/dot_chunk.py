"""All chunks at once for a prediction-free bias on a linear memory with scalar retention and gd
(linear attention, RetNet, simple GLA: ``core:chunkwise``'s fast case).

The bias ignores the memory (``core:dot``: ``u_t = -v_t``, docs/math.md), so every token's
update ``delta_t = -theta_t w_t u_t phi_t^T`` (``w_t`` the bias's per-token weight) is known
before any memory is: with ``A_t`` the running product of the retain factors inside a chunk and
``L[t, j] = A_t / A_j`` (`decay_matrix`, formed in log space),

    M_t  = A_t M_0 + sum_{j<=t} L[t, j] delta_j                 (inside one chunk)
    y_t  = A_t M_0 psi_t - sum_{j<=t} L[t, j] theta_j w_j (phi_j . psi_t) u_j   (read after)

Every chunk's intra-chunk part and its total update ``D_i = sum_j L[C-1, j] delta_j`` are one
batched product over all chunks; only the chunk-start memories ``M_{i+1} = A_{C-1} M_i + D_i``
form a short scan over the T / C chunks. Read before uses ``M_{t-1}``: the rows shift by one.
The result equals the token loop for any chunk size (tests/test_strategy_contract.py).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from .decay import log_floor, log_tiny



def _decays(alpha: torch.Tensor) -> torch.Tensor:
    """``L[..., t, j] = prod_{j<m<=t} alpha_m`` (0 above the diagonal) for ``alpha: [..., C]``,
    from running sums of ``log alpha`` inside the chunk: one C x C exponential, no matrix
    product. The log is floored at log(tiny) (-87 in float32), so a gate of exactly 0 gives
    ``e^-87`` or less across it, with a finite gradient, and costs later differences nothing.
    Factors below `decay.decay_floor` are 0."""
    C = alpha.shape[-1]
    cs = log_tiny(alpha).cumsum(-1)
    upper = torch.ones(C, C, dtype=torch.bool, device=alpha.device).triu(1)
    seg = cs.unsqueeze(-1) - cs.unsqueeze(-2)
    return torch.exp(seg.masked_fill(upper | (seg < log_floor(alpha.dtype)), float("-inf")))


def applies(rule) -> bool:
    """Whether `run_dot` computes this rule (its form's ``"dot_chunk"``): a per-token rule on a
    linear memory, prediction-free bias, one-token window, gd, scalar retention at the current
    point."""
    return "dot_chunk" in rule.form.chunk_forms


def run_dot(rule, p, C: int):
    """``(y [B, H, T, Dv], state)`` of the call ``p`` (`MemoryInputs`) in chunks of ``C``."""
    B, H, T = p.shape
    M0 = p.state["M"]  # [B, H, Dv, Dphi]
    if T == 0:
        return p.v.new_zeros(B, H, 0, M0.shape[-2]), {"M": M0}
    N = -(-T // C)
    pad = N * C - T

    def chunks(z: torch.Tensor, value: float = 0.0) -> torch.Tensor:  # [B, H, T, ...] -> [B, H, N, C, ...]
        z = F.pad(z, (0, 0) * (z.dim() - 3) + (0, pad), value=value) if pad else z
        # one copy into [B, H, T, ...] order: the batched products below then need none
        return z.contiguous().unflatten(2, (N, C))

    x, psi = chunks(p.phik), chunks(p.psi)  # [B, H, N, C, Dphi]
    # -theta_j w_j u_j, u_j = error(., v_j) (prediction-free: any prediction gives the same);
    # padded tokens weigh 0
    f = rule.form
    lag0 = rule.bias.lag_weights(p.v.dtype, p.v.device)[0]
    wt = p.gates[f.gate("step_size")] * p.gamma * lag0  # [B, H, T]
    # error(., v) = -v for the dot bias: the two signs cancel
    err, sign = (p.v, wt) if f.error == "dot" else (rule.bias.error(p.v, p.v), -wt)
    u = chunks(err) * chunks(sign).unsqueeze(-1)  # [B, H, N, C, Dv]
    if not f.retention_gated:  # alpha = 1: no decay
        L = torch.ones(C, C, dtype=u.dtype, device=u.device).tril()
        A = torch.ones(C, dtype=u.dtype, device=u.device).expand(B, H, N, C)
    else:
        alpha = chunks(p.alpha, 1.0)  # [B, H, N, C]
        L = _decays(alpha)  # [B, H, N, C, C], L[t, j] = A_t / A_j for j <= t
        A = torch.cumprod(alpha, dim=-1)  # [B, H, N, C]
    if f.read == "before":  # y_t reads M_{t-1}: the rows of t - 1, the start scaled by A_{t-1}
        Lr = torch.cat([torch.zeros_like(L[..., :1, :]), L[..., :-1, :]], dim=-2)
        Ar = torch.cat([torch.ones_like(A[..., :1]), A[..., :-1]], dim=-1)
    else:
        Lr, Ar = L, A
    y = (Lr * (psi @ x.transpose(-1, -2))) @ u  # the intra-chunk part: [B, H, N, C, Dv]
    # each chunk's total update D_i = sum_j L[C-1, j] (-theta_j w_j u_j) x_j^T: [B, H, N, Dv, Dphi]
    D = (u * L[..., -1, :].unsqueeze(-1)).transpose(-1, -2) @ x
    last = A[..., -1]  # [B, H, N]
    starts = []
    M = M0
    for i in range(N):  # the chunk-start memories: a scan over the T / C chunks
        starts.append(M)
        M = torch.addcmul(D[:, :, i], last[:, :, i, None, None], M)
    Ms = torch.stack(starts, dim=2)  # [B, H, N, Dv, Dphi]
    y = torch.addcmul(y, Ar.unsqueeze(-1), psi @ Ms.transpose(-1, -2))
    y = y.flatten(2, 3)
    return (y[:, :, :T] if pad else y), {"M": M}
