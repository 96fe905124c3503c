"""`decay_matrix` against the products it stands for, gates of exactly 0 and 1 included."""

import pytest
import torch

from atlas_core.forms.decay import decay_matrix


@pytest.mark.parametrize("C", [1, 5, 16])
def test_decay_matrix_equals_segment_products(C):
    g = torch.Generator().manual_seed(C)
    a = 0.5 + 0.5 * torch.rand(2, 3, C, generator=g, dtype=torch.float64)
    a[0, 0, C // 2] = 0.0  # a gate of exactly 0 cuts the products through it
    a[1, 2, 0] = 1.0
    L = decay_matrix(a)
    ref = torch.zeros(2, 3, C, C, dtype=torch.float64)
    for t in range(C):
        for j in range(t + 1):
            ref[..., t, j] = torch.prod(a[..., j + 1 : t + 1], dim=-1)
    torch.testing.assert_close(L, ref, rtol=1e-13, atol=0)
    assert not torch.isnan(L).any()


def test_decay_matrix_gradient_matches_products():
    g = torch.Generator().manual_seed(0)
    a = (0.6 + 0.4 * torch.rand(2, 6, generator=g, dtype=torch.float64)).requires_grad_()

    def by_products(x):
        rows = []
        for t in range(6):
            rows.append(torch.stack([torch.prod(x[..., j + 1 : t + 1], dim=-1) if j <= t
                                     else torch.zeros_like(x[..., 0]) for j in range(6)], dim=-1))
        return torch.stack(rows, dim=-2)

    w = torch.randn(2, 6, 6, generator=g, dtype=torch.float64)
    (ga,) = torch.autograd.grad((decay_matrix(a) * w).sum(), a)
    (gr,) = torch.autograd.grad((by_products(a) * w).sum(), a)
    torch.testing.assert_close(ga, gr, rtol=1e-11, atol=1e-13)
