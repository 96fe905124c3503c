"""`Muon.chunk_factors` (the anchored gradients as rank-one factors, used by the chunked
strategies on ``titans:mlp``) equals `Muon.chunk` on the gradients those factors form, float64:
per-token weights and the final momenta, windows 1 and 3, a non-zero starting state."""

from __future__ import annotations

import pytest
import torch

from atlas_core.forms.decay import decay_matrix
from atlas_plugins.atlas_muon.muon import Muon

DT = torch.float64


@pytest.mark.parametrize("c", [1, 3], ids=lambda c: f"window{c}")
def test_chunk_factors_equal_chunk_on_the_formed_gradients(c):
    g = torch.Generator().manual_seed(0)
    B, H, C, m = 2, 3, 5, 5 + c - 1
    shapes = {"W1": (6, 4), "W2": (4, 6)}
    W0 = {k: torch.randn(B, H, *s, generator=g, dtype=DT) for k, s in shapes.items()}
    opt0 = {f"Z.{k}": torch.randn(B, H, *s, generator=g, dtype=DT) for k, s in shapes.items()}
    fac = {k: (torch.randn(B, H, m, s[0], generator=g, dtype=DT), torch.randn(B, H, m, s[1], generator=g, dtype=DT))
           for k, s in shapes.items()}
    band = torch.tril(torch.ones(C, m, dtype=DT), diagonal=c - 1) - torch.tril(torch.ones(C, m, dtype=DT), diagonal=-1)
    Wm = band * torch.rand(B, H, 1, m, generator=g, dtype=DT)  # [B, H, C, m], c positions per row
    gates = {n: 0.5 + 0.5 * torch.rand(B, H, C, generator=g, dtype=DT) for n in ("eta", "theta", "alpha")}
    L = decay_matrix(gates["alpha"])
    A = torch.cumprod(gates["alpha"], dim=-1)
    muon = Muon(ns_steps=3)
    G = {k: torch.einsum("bhtl,bhlo,bhli->bhtoi", Wm, d, z) for k, (d, z) in fac.items()}
    ref, ref_opt = muon.chunk(W0, opt0, G, decay=L, decay_from_start=A, gates=gates)
    got, got_opt = muon.chunk_factors(W0, opt0, fac, Wm, decay=L, decay_from_start=A, gates=gates)
    for k in shapes:
        torch.testing.assert_close(got[k], ref[k], rtol=1e-12, atol=1e-12)
        torch.testing.assert_close(got_opt[f"Z.{k}"], ref_opt[f"Z.{k}"], rtol=1e-12, atol=1e-12)
