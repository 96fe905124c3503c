"""Hand-written loops of MATH.md's equations for linear memory, written independently of the
library (explicit matrices, no knob objects): the oracles the core strategies are tested against."""

from __future__ import annotations

import torch


def linear_memory_loop(q, k, v, gates, *, bias, algorithm, retention, read, anchor_every=1,
                       M0=None, Z0=None):
    """q, k: [B, T, H, D]; v: [B, T, H, Dv]; gates [B, T, H]. Returns y [B, T, H, Dv], M, Z.

    bias: "l2" (e = M k - v) or "dot" (e = -v); algorithm: "gd" or "momentum";
    retention: "decay" (alpha gate) or "none". Gradients at the memory at the start of the
    current block of `anchor_every` tokens."""
    B, T, H, Dk = k.shape
    Dv = v.shape[-1]
    M = torch.zeros(B, H, Dv, Dk, dtype=q.dtype) if M0 is None else M0.clone()
    Z = torch.zeros_like(M) if Z0 is None else Z0.clone()
    ys = []
    anchor = M
    for t in range(T):
        if t % anchor_every == 0:
            anchor = M
        kt, vt, qt = k[:, t], v[:, t], q[:, t]  # [B, H, D]
        if read == "before":
            ys.append(torch.einsum("bhvk,bhk->bhv", M, qt))
        if bias == "l2":
            e = torch.einsum("bhvk,bhk->bhv", anchor, kt) - vt
        else:
            e = -vt
        g = torch.einsum("bhv,bhk->bhvk", e, kt)
        a = gates["alpha"][:, t, :, None, None] if retention == "decay" else 1.0
        th = gates["theta"][:, t, :, None, None]
        if algorithm == "gd":
            M = a * M - th * g
        else:
            Z = gates["eta"][:, t, :, None, None] * Z + th * g
            M = a * M - Z
        if read == "after":
            ys.append(torch.einsum("bhvk,bhk->bhv", M, qt))
    return torch.stack(ys, dim=1), M, Z
