"""`atlas_core.forms.tril_inverse.unit_lower_inverse` (the chunked delta rule's batched inverse)
against LAPACK in float64: the inverse, its gradient (gradcheck), and `exact_chunk`'s solve on
both sides of the size where it switches from LAPACK's trsm to the inverse."""

from __future__ import annotations

import pytest
import torch

from atlas_core.forms import exact_chunk
from atlas_core.forms.tril_inverse import unit_lower_inverse


@pytest.mark.parametrize("n", [1, 2, 7, 8, 16, 24, 32, 40, 64, 96])
def test_the_inverse_equals_lapack(n):
    g = torch.Generator().manual_seed(n)
    N = 0.3 * torch.randn(3, 5, n, n, dtype=torch.float64, generator=g)
    want = torch.linalg.inv(torch.eye(n, dtype=torch.float64) + N.tril(-1))
    got = unit_lower_inverse(N)  # the diagonal and upper part of N are not read
    assert torch.allclose(got, want, rtol=1e-10, atol=1e-10)


@pytest.mark.parametrize("n", [5, 16, 24])
def test_the_gradient(n):
    N = torch.randn(2, n, n, dtype=torch.float64, generator=torch.Generator().manual_seed(1)).requires_grad_()
    assert torch.autograd.gradcheck(unit_lower_inverse, (N,))
    unit_lower_inverse(N).sum().backward()
    assert torch.count_nonzero(N.grad.triu()) == 0  # what is not read gets no gradient


@pytest.mark.parametrize("n", [exact_chunk.INVERT_FROM - 1, exact_chunk.INVERT_FROM, 64])
def test_the_chunk_solve_on_both_sides_of_the_switch(n):
    g = torch.Generator().manual_seed(n)
    N = (0.2 * torch.randn(2, 3, n, n, dtype=torch.float64, generator=g)).requires_grad_()
    R = torch.randn(2, 3, n, 11, dtype=torch.float64, generator=g).requires_grad_()
    (got,) = exact_chunk.unit_lower_solve(N, R)
    want = torch.linalg.solve_triangular(torch.eye(n, dtype=torch.float64) + N.tril(-1), R, upper=False)
    assert torch.allclose(got, want, rtol=1e-10, atol=1e-10)
    ga = torch.autograd.grad(got.square().sum(), (N, R))
    gb = torch.autograd.grad(want.square().sum(), (N, R))
    for a, b in zip(ga, gb):
        assert torch.allclose(a.tril(-1), b.tril(-1), rtol=1e-8, atol=1e-10)
