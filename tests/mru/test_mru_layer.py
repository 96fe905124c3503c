"""The MRU layer: the seed's reshaping, identity at initialisation, orthogonal transitions that stay
stable at T = 16384, strategies equal on outputs and parameter gradients, state carry, bad sizes."""

from __future__ import annotations

import pytest
import torch

from atlas_core.errors import SpecError
from atlas_plugins.mru.cumprod import cumprod
from atlas_plugins.mru.layer import MRULayer, matrix_order


def test_matrix_order_from_the_seed_sizes():
    assert matrix_order(64, 4) == 4  # d_h = 16, d_o = 4
    assert matrix_order(18, 2) == 3
    with pytest.raises(SpecError, match=r"64 / 2 = 32 is not a perfect square.*\[1, 4, 16, 64\]"):
        matrix_order(64, 2)
    with pytest.raises(SpecError, match=r"d_model=10 must be a positive multiple of heads"):
        matrix_order(10, 3)
    with pytest.raises(ValueError):  # SpecError is a ValueError
        MRULayer(24, 2)


def test_reshaping_matches_the_seed_formula():
    torch.manual_seed(0)
    layer = MRULayer(8, 2, init_scale=1.0, strategy="core:sequential").double()  # d_o = 2
    x = torch.randn(1, 3, 8, dtype=torch.float64)
    X = layer.transitions(x)
    # seed 002: Z = reshape(x, h, d_o, d_c) W_in per head, written with explicit loops
    for t in range(3):
        for h in range(2):
            xm = x[0, t, h * 4 : (h + 1) * 4].reshape(2, 2)
            Z = xm @ layer.w_in[h]
            torch.testing.assert_close(X[0, t, h], torch.linalg.matrix_exp(Z - Z.T))
    y, state = layer(x)
    H = state["H"]
    expect = torch.cat([(H[0, h] @ layer.w_out[h]).reshape(4) for h in range(2)])
    torch.testing.assert_close(y[0, -1], expect)


def test_identity_at_initialisation_and_gradient_still_flows():
    torch.manual_seed(0)
    layer = MRULayer(16, 4)  # init_scale = 0; d_h = 4, d_o = 2
    x = torch.randn(2, 5, 16, requires_grad=True)
    X = layer.transitions(x)
    assert torch.equal(X, torch.eye(2).expand_as(X))
    y, state = layer(x)
    assert torch.equal(state["H"], torch.eye(2).expand(2, 4, 2, 2))
    (y * torch.randn_like(y)).sum().backward()
    assert layer.w_in.grad.abs().max() > 1e-4  # exp'(0) is the identity on skew matrices


def test_transitions_are_orthogonal():
    torch.manual_seed(1)
    layer = MRULayer(18, 2, init_scale=2.0)
    X = layer.transitions(3 * torch.randn(2, 7, 18, dtype=torch.float32))
    eye = torch.eye(3).expand_as(X)
    torch.testing.assert_close(X @ X.mT, eye, rtol=0, atol=1e-5)


@pytest.mark.parametrize("strategy", ["mru:brent_kung", "mru:sklansky"])
def test_long_sequence_is_stable(strategy: str):
    # random inputs, a non-trivial W_in, T = 16384, float32: H_t stays orthogonal (no overflow or
    # underflow); ||H_t||_F^2 = d_o exactly in exact arithmetic
    torch.manual_seed(2)
    layer = MRULayer(18, 2, init_scale=1.0, strategy=strategy)
    x = torch.randn(1, 16384, 18)
    with torch.no_grad():
        H, state = layer.rule(layer.transitions(x), strategy=strategy)  # H: [1, T, heads, 3, 3]
    assert torch.isfinite(H).all()
    fro2 = H.pow(2).sum((-2, -1))
    assert (fro2 - 3).abs().max() < 2e-4  # measured ~1e-5; a float32 matrix_exp drifts to ~1e-2
    final = state["H"]
    torch.testing.assert_close(final @ final.mT, torch.eye(3).expand_as(final), rtol=0, atol=1e-4)
    # the same factors without the orthogonal map (the seed's X_t = Z_t) leave float32's range
    Z = torch.einsum("bthrc,hco->bthro", x.reshape(1, 16384, 2, 3, 3), layer.w_in.detach())
    with torch.no_grad():
        raw = cumprod(Z.movedim(1, 2), None, strategy.split(":")[1])
    last = raw[..., -1, :, :].abs().amax()
    assert not torch.isfinite(last) or last == 0 or last > 1e30 or last < 1e-30


def test_strategies_equal_on_outputs_and_parameter_gradients():
    grads = {}
    outs = {}
    for strategy in ["core:sequential", "mru:hillis_steele", "mru:brent_kung", "mru:sklansky"]:
        torch.manual_seed(3)
        layer = MRULayer(8, 2, init_scale=0.5, strategy=strategy).double()
        x = torch.randn(2, 11, 8, dtype=torch.float64, requires_grad=True)
        y, state = layer(x)
        (y.pow(2).sum() + state["H"].sum()).backward()
        outs[strategy] = y.detach()
        grads[strategy] = (x.grad, layer.w_in.grad, layer.w_out.grad)
    ref_y, ref_g = outs.pop("core:sequential"), grads.pop("core:sequential")
    for strategy, y in outs.items():
        torch.testing.assert_close(y, ref_y, rtol=0, atol=1e-10)
        for a, b in zip(grads[strategy], ref_g):
            torch.testing.assert_close(a, b, rtol=0, atol=1e-10)


def test_state_carry():
    torch.manual_seed(4)
    layer = MRULayer(8, 2, init_scale=1.0)
    x = torch.randn(2, 10, 8)
    y, state = layer(x)
    y1, s1 = layer(x[:, :4])
    y2, s2 = layer(x[:, 4:], s1)
    torch.testing.assert_close(torch.cat([y1, y2], 1), y, rtol=0, atol=1e-5)
    torch.testing.assert_close(s2["H"], state["H"], rtol=0, atol=1e-5)


def test_bad_input():
    layer = MRULayer(8, 2)
    with pytest.raises(ValueError, match=r"d_model=8.*\(2, 3, 6\)"):
        layer(torch.randn(2, 3, 6))
    with pytest.raises(ValueError, match=r"\[1, 2, 2, 2\].*\(1, 2, 3, 3\)"):
        layer(torch.randn(1, 3, 8), {"H": torch.randn(1, 2, 3, 3)})
    with pytest.raises(ValueError, match="init_scale"):
        MRULayer(8, 2, init_scale=-1.0)
