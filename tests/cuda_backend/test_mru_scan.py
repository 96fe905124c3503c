"""The Triton MRU scan (``cuda:mru_scan``) against the MRU's readable loop (``cumprod_loop``).

Checks H, the final state and the gradients w.r.t. X and the carried state h0 (relative RMS error
<= 1e-5, kernel in float32, reference in float64), for several kernel chunk sizes, T not a
multiple of the chunk, with and without h0, and for a d under 16 (broadcast products) and d = 16
(tl.dot). Runs in Triton's CPU interpreter (see conftest.py).
"""

from __future__ import annotations

import pytest
import torch
import triton  # noqa: F401 - without Triton this module must fail, not skip

import atlas_core as ac
from atlas_core.backends import select_backend
from atlas_core.strategies.base import build_strategy
from atlas_plugins.cuda_backend.backend_mru import MRUScanBackend
from atlas_plugins.cuda_backend.mru_scan import mru_scan
from atlas_plugins.mru.cumprod import cumprod_loop

from .oracle import rel_rms

pytestmark = pytest.mark.triton
TOL = 1e-5


def _factors(d, T=37, seed=0, carried=True):
    g = torch.Generator().manual_seed(seed)
    X = torch.eye(d, dtype=torch.float64) + 0.3 * torch.randn(1, 2, T, d, d, generator=g, dtype=torch.float64) / d**0.5
    h0 = torch.randn(1, 2, d, d, generator=g, dtype=torch.float64) if carried else None
    return X.requires_grad_(True), (h0.requires_grad_(True) if carried else None)


@pytest.mark.parametrize("d", [4, 16], ids=["d4", "d16"])
@pytest.mark.parametrize("chunk", [4, 16], ids=["chunk4", "chunk16"])
@pytest.mark.parametrize("carried", [False, True], ids=["h0-identity", "h0-carried"])
def test_scan_matches_the_loop(d, chunk, carried, device):
    X, h0 = _factors(d, carried=carried)
    leaves = [X] + ([h0] if carried else [])
    want = cumprod_loop(X, h0)
    w = torch.randn(want.shape, generator=torch.Generator().manual_seed(1), dtype=torch.float64)
    g_want = torch.autograd.grad((want * w).sum(), leaves)
    got = mru_scan(X.float().to(device), h0.float().to(device) if carried else None, chunk=chunk)
    assert got.dtype == torch.float32
    g_got = torch.autograd.grad((got.double().cpu() * w).sum(), leaves)
    assert rel_rms(got.cpu(), want) <= TOL
    for a, b in zip(g_got, g_want):
        assert rel_rms(a, b) <= TOL


def test_backend_serves_the_mru_rule_and_matches_the_reference(device):
    rule = ac.build_rule({"use": "mru:mru"})
    X, h0 = _factors(8, T=21, seed=2)
    strat = build_strategy("mru:brent_kung")
    p32 = rule.prepare(X.detach().float().transpose(1, 2).to(device), state={"H": h0.detach().float().to(device)})
    backend = select_backend(strat, rule, p32)
    assert isinstance(backend, MRUScanBackend)
    H, state = backend.run(strat, rule, p32)
    p64 = rule.prepare(X.detach().transpose(1, 2), state={"H": h0.detach()})
    H_ref, state_ref = rule.reference(p64)
    assert rel_rms(H.cpu(), H_ref) <= TOL and rel_rms(state["H"].cpu(), state_ref["H"]) <= TOL


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=["bf16", "fp16"])
def test_half_inputs(dtype, device):
    """Every scan product has a float32 running product as an operand, so all are IEEE (the TF32
    emulation of the interpreter would show it otherwise); the tolerances cover the half rounding
    of the inputs' gradients and of H."""
    X, _ = _factors(8, T=21, seed=4, carried=False)
    Xh = X.detach().to(device=device, dtype=dtype).requires_grad_(True)
    got = mru_scan(Xh, chunk=8)
    assert got.dtype == dtype
    Xr = Xh.detach().cpu().double().requires_grad_(True)
    want = cumprod_loop(Xr)
    assert rel_rms(got.float().cpu(), want) <= 1e-2
    w = torch.randn(want.shape, dtype=torch.float64)
    (got.double().cpu() * w).sum().backward()
    (want * w).sum().backward()
    assert Xh.grad.dtype == dtype and rel_rms(Xh.grad.float().cpu(), Xr.grad) <= 2e-2


def test_refusals():
    be = MRUScanBackend()
    strat = build_strategy("mru:brent_kung")
    rule = ac.build_rule({"use": "mru:mru"})
    ok, why = be.verify(strat, rule, rule.prepare(torch.randn(1, 3, 1, 128, 128)))
    assert not ok and "d=128 exceeds 64" in why
    ok, why = be.verify(strat, rule, rule.prepare(torch.randn(1, 3, 1, 4, 4, dtype=torch.float64)))
    assert not ok and "float64" in why
    linear = ac.build_rule({"bias": "core:l2"}, heads=1, d_key=4, d_value=4)
    p = linear.prepare(*(torch.randn(1, 3, 1, 4) for _ in range(3)), gates={"theta": torch.rand(1, 3, 1)})
    ok, why = be.verify(strat, linear, p)
    assert not ok and "mru:mru rule only" in why
    with pytest.raises(ValueError, match="X must be"):
        mru_scan(torch.randn(2, 3, 4, 4))
