"""Hand-written loops of docs/math.md's Muon rule, written independently of the library (explicit
matrices, a per-matrix Newton–Schulz, no knob objects): the oracles the atlas_muon code is tested
against. float64 throughout."""

from __future__ import annotations

import torch

QUINTIC = (3.4445, -4.7750, 2.0315)


def ns_matrix(G: torch.Tensor, steps: int = 5, coeffs=QUINTIC, eps: float = 1e-7) -> torch.Tensor:
    """NS_k for ONE matrix [r, c], exactly as docs/math.md writes it."""
    a, b, c = coeffs
    X = G / (torch.sqrt((G * G).sum()) + eps)
    tall = G.shape[0] > G.shape[1]
    if tall:
        X = X.T
    for _ in range(steps):
        A = X @ X.T
        X = a * X + (b * A + c * A @ A) @ X
    return X.T if tall else X


def ns_each(G: torch.Tensor, steps: int = 5, coeffs=QUINTIC) -> torch.Tensor:
    """ns_matrix applied to every trailing matrix by a Python loop."""
    flat = G.reshape(-1, *G.shape[-2:])
    return torch.stack([ns_matrix(m, steps, coeffs) for m in flat]).reshape(G.shape)


def window_terms(t, c, ext_k, ext_v, ext_g):
    """The (key, value, weight) of the c positions of the window ending at token t, where the
    extended sequences hold the c - 1 carried tokens first. Each: [B, H, ...] per position."""
    return [(ext_k[:, :, t + j], ext_v[:, :, t + j], ext_g[:, :, t + j]) for j in range(c)]


def muon_linear_loop(q, k, v, gates, *, window=1, read="after", anchor_every=1, ns_steps=5,
                     coeffs=QUINTIC, gamma=None, state=None):
    """Linear memory, l2 bias over a window of c tokens (every term at the anchor), decay, Muon.

    q, k: [B, T, H, D]; v: [B, T, H, Dv]; gates [B, T, H]; gamma [B, T, H] or None (= 1).
    Returns y [B, T, H, Dv] and the final (M, Z, window buffers)."""
    B, T, H, Dk = k.shape
    Dv = v.shape[-1]
    c = window
    st = state or {}
    M = st.get("M", torch.zeros(B, H, Dv, Dk, dtype=q.dtype)).clone()
    Z = st.get("Z.M", torch.zeros_like(M)).clone()
    gam = torch.ones(B, T, H, dtype=q.dtype) if gamma is None else gamma
    # carried window (zeros with weight 0 = empty) followed by this call's tokens, [B, H, c-1+T, .]
    ext_k = torch.cat([st.get("window.k", torch.zeros(B, H, c - 1, Dk, dtype=q.dtype)), k.transpose(1, 2)], 2)
    ext_v = torch.cat([st.get("window.v", torch.zeros(B, H, c - 1, Dv, dtype=q.dtype)), v.transpose(1, 2)], 2)
    ext_g = torch.cat([st.get("window.gamma", torch.zeros(B, H, c - 1, dtype=q.dtype)), gam.transpose(1, 2)], 2)
    ys = []
    anchor = M
    for t in range(T):
        if t % anchor_every == 0:
            anchor = M
        qt = q[:, t]
        if read == "before":
            ys.append(torch.einsum("bhvk,bhk->bhv", M, qt))
        g = torch.zeros_like(M)
        for ki, vi, wi in window_terms(t, c, ext_k, ext_v, ext_g):
            e = torch.einsum("bhvk,bhk->bhv", anchor, ki) - vi
            g = g + wi[..., None, None] * torch.einsum("bhv,bhk->bhvk", e, ki)
        a, et, th = (gates[n][:, t, :, None, None] for n in ("alpha", "eta", "theta"))
        Z = et * Z + g
        M = a * M - th * ns_each(Z, ns_steps, coeffs)
        if read == "after":
            ys.append(torch.einsum("bhvk,bhk->bhv", M, qt))
    final = {"M": M, "Z.M": Z}
    if c > 1:
        final.update({"window.k": ext_k[:, :, -(c - 1):], "window.v": ext_v[:, :, -(c - 1):],
                      "window.gamma": ext_g[:, :, -(c - 1):]})
    return torch.stack(ys, dim=1), final


def mlp(Ws, x, act, residual=True):
    """Ws: list of [B, H, out, in] (first layer first); x: [B, H, in] -> [B, H, out]."""
    h = x
    for i, W in enumerate(Ws):
        h = torch.einsum("bhoi,bhi->bho", W, h)
        if i < len(Ws) - 1:
            h = act(h)
    return x + h if residual else h


def muon_mlp_loop(Ws0, q, k, v, gates, act, *, window=1, read="after", anchor_every=1):
    """Deep memory (residual MLP), l2 bias over a window, decay, Muon: one Z and one NS per
    weight matrix, the inner gradient by autograd. The memory reads with ``Ws0 + O`` (its initial
    weights plus the offset O, zero at the start), and the algorithm and retention update O.
    Returns y and the final offsets and momenta."""
    B, T, H, Dk = k.shape
    c = window
    Ws = [torch.zeros_like(w) for w in Ws0]  # the offsets

    def eff(offsets):
        return [w0 + o for w0, o in zip(Ws0, offsets)]

    Zs = [torch.zeros_like(w) for w in Ws]
    ext_k = torch.cat([torch.zeros(B, H, c - 1, Dk, dtype=q.dtype), k.transpose(1, 2)], 2)
    ext_v = torch.cat([torch.zeros(B, H, c - 1, v.shape[-1], dtype=q.dtype), v.transpose(1, 2)], 2)
    ext_g = torch.cat([torch.zeros(B, H, c - 1, dtype=q.dtype), torch.ones(B, H, T, dtype=q.dtype)], 2)
    ys = []
    anchor = Ws
    for t in range(T):
        if t % anchor_every == 0:
            anchor = Ws
        qt = q[:, t]
        if read == "before":
            ys.append(mlp(eff(Ws), qt, act))
        leaf = [w.detach().requires_grad_(True) for w in anchor]
        loss = 0
        for ki, vi, wi in window_terms(t, c, ext_k, ext_v, ext_g):
            loss = loss + (wi[..., None] * 0.5 * (mlp(eff(leaf), ki, act) - vi).pow(2)).sum()
        grads = torch.autograd.grad(loss, leaf)
        a, et, th = (gates[n][:, t, :, None, None] for n in ("alpha", "eta", "theta"))
        Zs = [et * z + g for z, g in zip(Zs, grads)]
        Ws = [a * w - th * ns_each(z) for w, z in zip(Ws, Zs)]
        if read == "after":
            ys.append(mlp(eff(Ws), qt, act))
    return torch.stack(ys, dim=1), Ws, Zs
