"""Hand-written loops of docs/math.md's equations for linear memory, written independently of the
library (explicit matrices, no knob objects): the oracles the core strategies are tested against."""

from __future__ import annotations

import torch


def linear_memory_loop(q, k, v, gates, *, bias, algorithm, retention, read, anchor=1, start=0,
                       M0=None, Z0=None, A0=None):
    """q, k: [B, T, H, D]; v: [B, T, H, Dv]; gates [B, T, H].

    Returns ``(y [B, T, H, Dv], M, Z, held)``: the outputs, the final memory and momentum, and
    the anchor memory held at the end (the memory of the block in progress, or the final memory
    when the next token opens a block).

    bias: "l2" (e = M k - v) or "dot" (e = -v); algorithm: "gd" or "momentum";
    retention: "decay" (alpha gate) or "none". Anchoring (docs/math.md): the sequence is cut into
    blocks of ``anchor`` tokens aligned to absolute positions counted from the start of the
    sequence; the first token here sits at absolute position ``start``, and every gradient is
    taken at the memory before the token that opened its block. When ``start`` is not a block
    start, that memory is ``A0`` (the carried anchor memory; required)."""
    B, T, H, Dk = k.shape
    Dv = v.shape[-1]
    M = torch.zeros(B, H, Dv, Dk, dtype=q.dtype) if M0 is None else M0.clone()
    Z = torch.zeros_like(M) if Z0 is None else Z0.clone()
    if start % anchor:
        if A0 is None:
            raise ValueError("a call that starts inside an anchor block needs the block's memory A0")
        held = A0.clone()
    else:
        held = M
    ys = []
    for t in range(T):
        if (start + t) % anchor == 0:
            held = M
        kt, vt, qt = k[:, t], v[:, t], q[:, t]  # [B, H, D]
        if read == "before":
            ys.append(torch.einsum("bhvk,bhk->bhv", M, qt))
        if bias == "l2":
            e = torch.einsum("bhvk,bhk->bhv", held, kt) - vt
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
    if (start + T) % anchor == 0:
        held = M
    y = torch.stack(ys, dim=1) if ys else v.new_zeros(B, 0, H, Dv)
    return y, M, Z, held
