"""Newton–Schulz (docs/math.md, "Newton–Schulz"): spectrum, symmetry, batching, precision, zeros."""

from __future__ import annotations

import pytest
import torch

from atlas_plugins.atlas_muon.newton_schulz import newton_schulz

from .loops import ns_matrix

DT = torch.float64


def with_singular_values(r, c, s, gen):
    """Random [N, r, c] matrices whose singular values are s: [N, min(r, c)]."""
    N, n = s.shape
    U, _ = torch.linalg.qr(torch.randn(N, r, n, generator=gen, dtype=DT))
    V, _ = torch.linalg.qr(torch.randn(N, c, n, generator=gen, dtype=DT))
    return U @ torch.diag_embed(s) @ V.mT


@pytest.mark.parametrize("shape", [(8, 8), (4, 8), (8, 4), (16, 5), (32, 32)], ids=lambda s: f"{s[0]}x{s[1]}")
def test_singular_values_land_in_band(shape):
    """Singular values in [0.05, 1] go to about [0.68, 1.14] after 5 steps (approximate, not 1)."""
    gen = torch.Generator().manual_seed(0)
    r, c = shape
    s = 0.05 + 0.95 * torch.rand(40, min(r, c), generator=gen, dtype=DT)
    s[:, 0], s[:, -1] = 0.05, 1.0  # both ends of the interval in every matrix
    sv = torch.linalg.svdvals(newton_schulz(with_singular_values(r, c, s, gen)))
    lo, hi = sv.min().item(), sv.max().item()
    assert 0.68 <= lo and hi <= 1.14, (lo, hi)
    assert hi - lo > 0.1  # it does not converge to exactly 1 (the quintic trades accuracy for speed)


def test_keeps_singular_vectors():
    """NS_k(U S V^T) = U f(S) V^T: the output shares the input's singular vectors."""
    gen = torch.Generator().manual_seed(1)
    G = torch.randn(6, 9, generator=gen, dtype=DT)
    U, S, Vh = torch.linalg.svd(G, full_matrices=False)
    X = newton_schulz(G)
    inner = U.T @ X @ Vh.T  # diagonal if the singular vectors are kept
    torch.testing.assert_close(inner, torch.diag(torch.diagonal(inner)), rtol=0, atol=1e-10)


def test_matches_the_written_algorithm():
    gen = torch.Generator().manual_seed(2)
    for r, c in [(5, 5), (3, 7), (7, 3)]:
        G = torch.randn(r, c, generator=gen, dtype=DT)
        for steps in (0, 1, 5):
            torch.testing.assert_close(newton_schulz(G, steps), ns_matrix(G, steps), rtol=0, atol=1e-12)
    G = torch.randn(4, 6, generator=gen, dtype=DT)
    coeffs = (1.5, -0.5, 0.0)  # the cubic Newton–Schulz
    torch.testing.assert_close(newton_schulz(G, 7, coeffs), ns_matrix(G, 7, coeffs), rtol=0, atol=1e-12)


def test_steps_zero_only_normalises():
    G = torch.randn(2, 3, 4, 5, dtype=DT)
    X = newton_schulz(G, steps=0)
    norms = torch.linalg.matrix_norm(X)
    torch.testing.assert_close(norms, torch.ones_like(norms), rtol=0, atol=1e-6)
    torch.testing.assert_close(X * torch.linalg.matrix_norm(G, keepdim=True), G, rtol=1e-6, atol=0)


@pytest.mark.parametrize("shape", [(5, 7), (7, 5), (6, 6)], ids=lambda s: f"{s[0]}x{s[1]}")
def test_transpose_symmetry(shape):
    G = torch.randn(3, *shape, dtype=DT)
    torch.testing.assert_close(newton_schulz(G.mT), newton_schulz(G).mT, rtol=0, atol=1e-12)


@pytest.mark.parametrize("lead", [(), (3,), (2, 3), (2, 2, 3)], ids=lambda s: f"lead{len(s)}")
def test_batched_equals_per_matrix(lead):
    """Any leading dims: a [B, H, d, d] input is orthogonalised per matrix (never skipped)."""
    G = torch.randn(*lead, 4, 6, dtype=DT)
    X = newton_schulz(G)
    flat_in, flat_out = G.reshape(-1, 4, 6), X.reshape(-1, 4, 6)
    for g, x in zip(flat_in, flat_out):
        torch.testing.assert_close(x, newton_schulz(g), rtol=0, atol=1e-12)
    if lead:  # 3-D and higher inputs are really changed (the known bug returns them unchanged)
        assert (X - G).abs().max() > 0.1


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=str)
def test_half_precision_is_computed_in_float32(dtype):
    G = torch.randn(2, 3, 8, 8).to(dtype)
    X = newton_schulz(G)
    assert X.dtype == dtype
    # exactly the float32 computation, cast back: no step ran in half precision
    torch.testing.assert_close(X, newton_schulz(G.float()).to(dtype), rtol=0, atol=0)
    naive = ns_matrix(G[0, 0])  # every step in half precision drifts away from it
    ref = newton_schulz(G[0, 0].double())
    assert (X[0, 0].double() - ref).abs().max() <= (naive.double() - ref).abs().max()


def test_float_dtypes_kept():
    for dtype in (torch.float32, torch.float64):
        assert newton_schulz(torch.randn(3, 4, dtype=dtype)).dtype == dtype


def test_zero_matrix_no_nan_and_finite_gradient():
    G = torch.zeros(2, 4, 3, dtype=DT, requires_grad=True)
    X = newton_schulz(G)
    assert torch.equal(X, torch.zeros_like(X))
    (X * torch.randn_like(X)).sum().backward()
    assert torch.isfinite(G.grad).all()


def test_differentiable_gradcheck():
    G = torch.randn(2, 3, 4, dtype=DT, requires_grad=True)
    assert torch.autograd.gradcheck(lambda x: newton_schulz(x, 3), (G,))


@pytest.mark.parametrize(
    "kwargs, match",
    [
        (dict(steps=-1), r"steps=-1 must be an integer >= 0"),
        (dict(coefficients=(1.0, float("nan"), 0.0)), r"coefficients=.*must be three finite"),
        (dict(coefficients=(1.0, 2.0)), r"must be three finite numbers"),
        (dict(eps=0.0), r"eps=0.0 must be a finite number > 0"),
    ],
    ids=["steps", "nan-coeff", "two-coeffs", "eps"],
)
def test_bad_arguments(kwargs, match):
    with pytest.raises(ValueError, match=match):
        newton_schulz(torch.randn(3, 3), **kwargs)


def test_bad_tensor():
    with pytest.raises(ValueError, match=r"at least 2 dimensions .*\(5,\)"):
        newton_schulz(torch.randn(5))
    with pytest.raises(ValueError, match=r"floating-point"):
        newton_schulz(torch.ones(3, 3, dtype=torch.int64))
