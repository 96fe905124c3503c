"""The compiled row-wise kernels of a decode step (``csrc/rows.cpp``: `Norm`'s residual add with
the RMSNorm after it, a post-norm block's add, the argmax) against PyTorch: rows of several
sizes, with and without a weight and a residual; the argmax's ties, NaN and infinities as
``torch.argmax`` treats them; float64 and bfloat16 rows take the reference; denormals flushed on
every thread of the pool inside `denormals_flushed` and as they were after."""

from __future__ import annotations

import shutil

import pytest
import torch
from torch import nn

from atlas_core.decode.norm import Norm, argmax

needs_compiler = pytest.mark.skipif(shutil.which("c++") is None, reason="no C++ compiler on this machine")


def norm_module(D: int, affine: bool, eps: float | None = 1e-6) -> nn.RMSNorm:
    m = nn.RMSNorm(D, eps=eps, elementwise_affine=affine)
    if affine:
        with torch.no_grad():
            m.weight.copy_(1 + 0.3 * torch.randn(D))
    return m


@needs_compiler
@pytest.mark.parametrize("D", [7, 64, 1024, 1037])
@pytest.mark.parametrize("affine", [True, False])
@pytest.mark.parametrize("with_residual", [True, False])
def test_add_rms_norm_equals_pytorch(D, affine, with_residual):
    torch.manual_seed(D)
    m = norm_module(D, affine)
    n = Norm(m, torch.float32)
    assert n.fns is not None
    x, r = 3 * torch.randn(3, D), torch.randn(3, D)
    want_x = x + r if with_residual else x.clone()
    want = m(want_x)
    got_x = x.clone()
    got = n(got_x, r if with_residual else None)
    torch.testing.assert_close(got_x, want_x, rtol=0, atol=0)  # the add is exact
    torch.testing.assert_close(got, want, rtol=2e-6, atol=2e-6)


@needs_compiler
@pytest.mark.parametrize("affine", [True, False])
def test_add_normed_equals_pytorch(affine):
    m = norm_module(96, affine, eps=None)  # eps None: float32's, as nn.RMSNorm takes it
    n = Norm(m, torch.float32)
    x, r = torch.randn(2, 96), 0.01 * torch.randn(2, 96)
    want = x + m(r)
    got = n.add_normed(x.clone(), r)
    torch.testing.assert_close(got, want, rtol=2e-6, atol=2e-6)


@needs_compiler
def test_heads_are_rows():
    m = norm_module(32, True)
    n = Norm(m, torch.float32)
    q = torch.randn(2, 4, 1, 32)
    torch.testing.assert_close(n(q), m(q), rtol=2e-6, atol=2e-6)


def test_other_dtypes_and_layouts_take_the_reference():
    m = norm_module(16, True).double()
    n = Norm(m, torch.float64)
    assert n.fns is None
    x = torch.randn(2, 16, dtype=torch.float64)
    torch.testing.assert_close(n(x), m(x), rtol=0, atol=0)
    m32 = norm_module(16, True)
    n32 = Norm(m32, torch.float32)
    xt = torch.randn(16, 2).t()  # not contiguous
    torch.testing.assert_close(n32(xt), m32(xt), rtol=0, atol=0)
    # a bfloat16 module's weight is copied into the stream's float32
    m16 = norm_module(16, True).bfloat16()
    n16 = Norm(m16, torch.float32)
    assert n16.w.dtype == torch.float32
    x = torch.randn(3, 16)
    torch.testing.assert_close(n16(x), nn.functional.rms_norm(x, (16,), m16.weight.float(), 1e-6),
                               rtol=2e-6, atol=2e-6)


def test_another_norm_runs_as_itself():
    ln = nn.LayerNorm(8).bfloat16()
    n = Norm(ln, torch.float32)
    x = torch.randn(2, 8)
    got = n(x)
    assert got.dtype == torch.float32
    torch.testing.assert_close(got, ln(x.bfloat16()).float())


@needs_compiler
def test_argmax_equals_torch():
    g = torch.Generator().manual_seed(0)
    x = torch.randn(3, 248_320, generator=g)
    x[1, 5], x[1, 200_000] = 50.0, 50.0  # a tie: the first
    x[2] = float("-inf")
    x[2, 77_777] = float("inf")
    assert argmax(x).tolist() == x.argmax(-1).tolist() == [int(x[0].argmax()), 5, 77_777]
    nan = torch.randn(2, 1000, generator=g)
    nan[0, 10], nan[0, 3], nan[0, 900] = 1e9, float("nan"), float("nan")
    nan[1] = float("-inf")  # every value the same: the first
    assert argmax(nan).tolist() == nan.argmax(-1).tolist() == [3, 0]
    odd = torch.randn(1, 37, generator=g)
    assert argmax(odd).tolist() == odd.argmax(-1).tolist()
    assert argmax(x.double()).tolist() == x.argmax(-1).tolist()  # float64: torch's own


@needs_compiler
def test_denormals_are_flushed_on_every_thread_inside_and_restored_after():
    from atlas_core.decode.cpu_kernel import denormals_flushed

    x = torch.full((1 << 18,), 1e-30)  # large enough for every thread of the pool to take a part
    below = x * 1e-10  # 1e-40: a float32 denormal
    assert (below != 0).all()
    with denormals_flushed():
        assert (x * 1e-10 == 0).all()
        # nested: still on, and still on when the inner block ends
        with denormals_flushed():
            pass
        assert (x * 1e-10 == 0).all()
    assert (x * 1e-10 != 0).all()
