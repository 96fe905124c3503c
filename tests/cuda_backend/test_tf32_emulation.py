"""The interpreter's TF32 emulation (conftest.py `tf32_emulation`): a ``tl.dot`` with
``input_precision="tf32"`` multiplies operands rounded to 10 mantissa bits, as a GPU's tensor cores
do, while ``"ieee"`` stays float32 — so the half-precision kernel tests see the GPU's precision."""

from __future__ import annotations

import pytest
import torch
import triton
import triton.language as tl

from .conftest import GPU, tf32_round

pytestmark = pytest.mark.triton


@triton.jit
def _dot(a, b, c, PREC: tl.constexpr):
    r = tl.arange(0, 16)
    A = tl.load(a + r[:, None] * 16 + r[None, :])
    B = tl.load(b + r[:, None] * 16 + r[None, :])
    tl.store(c + r[:, None] * 16 + r[None, :], tl.dot(A, B, input_precision=PREC))


def _run(prec, device):
    g = torch.Generator().manual_seed(0)
    a, b = (1 + torch.rand(16, 16, generator=g) for _ in range(2))
    c = torch.empty(16, 16, device=device)
    _dot[(1,)](a.to(device), b.to(device), c, PREC=prec)
    return a, b, c.cpu()


def test_rounding_is_to_nearest_with_ties_away():
    one = 1.0
    ulp = 2.0**-10  # TF32's spacing at 1
    x = torch.tensor([one + ulp / 4, one + ulp / 2, one + 3 * ulp / 4, -(one + ulp / 2), 3.0]).numpy()
    got = tf32_round(x).tolist()
    assert got == [one, one + ulp, one + ulp, -(one + ulp), 3.0]


def test_tf32_dot_rounds_operands_and_ieee_does_not(device):
    a, b, c = _run("tf32", device)
    exact = (a.double() @ b.double()).float()
    rounded = torch.from_numpy(tf32_round(a.numpy())).double() @ torch.from_numpy(tf32_round(b.numpy())).double()
    err_tf32 = ((c - exact).abs().max() / exact.abs().max()).item()
    assert err_tf32 > 1e-5  # visibly TF32 (operands carry 23 random mantissa bits)
    if not GPU:  # the emulation multiplies exactly the rounded operands
        torch.testing.assert_close(c.double(), rounded, rtol=1e-6, atol=0)
    _, _, c_ieee = _run("ieee", device)
    assert ((c_ieee - exact).abs().max() / exact.abs().max()).item() < 1e-6
