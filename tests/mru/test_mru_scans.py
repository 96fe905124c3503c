"""The MRU scans: every strategy equals the left-to-right product loop (forward and gradients),
the closed-form backward passes gradcheck and never writes its incoming gradient, and the parallel
scans run in O(log T) sequential steps."""

from __future__ import annotations

import math

import pytest
import torch

from atlas_plugins.mru.cumprod import FUNCTIONS, cumprod, cumprod_loop, mru_scan
from atlas_plugins.mru.scans import ALGORITHMS, count_steps, get_algorithm

PARALLEL = ["hillis_steele", "brent_kung", "sklansky"]
STRATEGIES = [*PARALLEL, "sequential"]  # "sequential": loops driving the closed-form backward
LENGTHS = [1, 2, 7, 64, 100, 1000]


def near_orthogonal(*shape: int, gen: torch.Generator) -> torch.Tensor:
    """Random matrices with singular values near 1, so products of 1000 of them stay O(1) and an
    absolute tolerance of 1e-10 means something."""
    d = shape[-1]
    q, _ = torch.linalg.qr(torch.randn(*shape, generator=gen, dtype=torch.float64))
    scale = 1.0 + 0.01 * torch.randn(*shape[:-2], 1, 1, generator=gen, dtype=torch.float64)
    return q * scale + 0.05 * torch.randn(*shape[:-2], d, d, generator=gen, dtype=torch.float64)


def make(T: int, B: int = 1, H: int = 2, d: int = 2, seed: int = 0):
    gen = torch.Generator().manual_seed(seed + T)
    X = near_orthogonal(B, T, H, d, d, gen=gen).requires_grad_()
    h0 = near_orthogonal(B, H, d, d, gen=gen).requires_grad_()
    G = torch.randn(B, T, H, d, d, generator=gen, dtype=torch.float64)
    return X, h0, G


def loop_reference(X: torch.Tensor, h0: torch.Tensor | None) -> torch.Tensor:
    """``H_t = H_{t-1} X_t`` written out in the rule layout [B, T, H, d, d], plain autograd."""
    B, T, Hh, d, _ = X.shape
    H_t = torch.eye(d, dtype=X.dtype).expand(B, Hh, d, d) if h0 is None else h0
    out = []
    for t in range(T):
        H_t = H_t @ X[:, t]
        out.append(H_t)
    return torch.stack(out, dim=1)


@pytest.mark.parametrize("T", LENGTHS, ids=[f"T{t}" for t in LENGTHS])
@pytest.mark.parametrize("strategy", STRATEGIES)
@pytest.mark.parametrize("with_h0", [True, False], ids=["h0", "identity"])
def test_strategy_equals_loop(strategy: str, T: int, with_h0: bool):
    X, h0, G = make(T)
    h0 = h0 if with_h0 else None
    inputs = (X, h0) if with_h0 else (X,)
    ref = loop_reference(X, h0)
    ref_grads = torch.autograd.grad(ref, inputs, G)
    out = mru_scan(X, h0, strategy)
    grads = torch.autograd.grad(out, inputs, G)
    assert out.shape == ref.shape == X.shape
    torch.testing.assert_close(out, ref, rtol=0, atol=1e-10)
    for g, r in zip(grads, ref_grads):
        torch.testing.assert_close(g, r, rtol=0, atol=1e-10)


def test_library_loop_matches_written_out_loop():
    # cumprod_loop (the rule's reference) and the loop above are two independent spellings
    X, h0, _ = make(9)
    Xt = X.detach().movedim(1, 2)  # [B, H, T, d, d]
    torch.testing.assert_close(
        cumprod_loop(Xt, h0.detach()).movedim(2, 1), loop_reference(X, h0).detach(), rtol=0, atol=1e-12
    )


@pytest.mark.parametrize("strategy", STRATEGIES)
def test_sum_loss_with_expanded_gradient(strategy: str):
    # out.sum() hands backward an expanded (stride-0) gradient; the backward must cope with it
    X, h0, _ = make(13)
    (gx_ref, gh_ref) = torch.autograd.grad(loop_reference(X, h0).sum(), (X, h0))
    (gx, gh) = torch.autograd.grad(mru_scan(X, h0, strategy).sum(), (X, h0))
    torch.testing.assert_close(gx, gx_ref, rtol=0, atol=1e-10)
    torch.testing.assert_close(gh, gh_ref, rtol=0, atol=1e-10)


@pytest.mark.parametrize("T", [1, 2, 3, 5], ids=lambda t: f"T{t}")
@pytest.mark.parametrize("strategy", STRATEGIES)
def test_gradcheck(strategy: str, T: int):
    gen = torch.Generator().manual_seed(T)
    X = torch.randn(1, T, 2, 2, 2, generator=gen, dtype=torch.float64, requires_grad=True)
    h0 = torch.randn(1, 2, 2, 2, generator=gen, dtype=torch.float64, requires_grad=True)
    assert torch.autograd.gradcheck(lambda x, h: mru_scan(x, h, strategy), (X, h0))
    assert torch.autograd.gradcheck(lambda x: mru_scan(x, None, strategy), (X,))


@pytest.mark.parametrize("strategy", STRATEGIES)
def test_backward_never_writes_its_inputs(strategy: str):
    X, h0, G = make(11)
    G_before, X_before, h0_before = G.clone(), X.detach().clone(), h0.detach().clone()
    out = mru_scan(X, h0, strategy)
    torch.autograd.grad(out, (X, h0), G)
    assert torch.equal(G, G_before), "the incoming gradient buffer was modified"
    assert torch.equal(X.detach(), X_before) and torch.equal(h0.detach(), h0_before)


@pytest.mark.parametrize("strategy", STRATEGIES)
def test_only_requested_gradients(strategy: str):
    X, h0, G = make(5)
    h0_const = h0.detach()
    (gx,) = torch.autograd.grad(mru_scan(X, h0_const, strategy), (X,), G)
    (gx_ref,) = torch.autograd.grad(loop_reference(X, h0_const), (X,), G)
    torch.testing.assert_close(gx, gx_ref, rtol=0, atol=1e-10)
    X_const = X.detach()
    (gh,) = torch.autograd.grad(mru_scan(X_const, h0, strategy), (h0,), G)
    (gh_ref,) = torch.autograd.grad(loop_reference(X_const, h0), (h0,), G)
    torch.testing.assert_close(gh, gh_ref, rtol=0, atol=1e-10)


def test_state_carry_two_calls_equal_one():
    X, h0, _ = make(20)
    for strategy in STRATEGIES:
        whole = mru_scan(X, h0, strategy)
        first = mru_scan(X[:, :8], h0, strategy)
        second = mru_scan(X[:, 8:], first[:, -1], strategy)
        torch.testing.assert_close(torch.cat([first, second], 1), whole, rtol=0, atol=1e-12)


def test_leading_batch_dims_and_float32():
    gen = torch.Generator().manual_seed(3)
    X = near_orthogonal(2, 3, 10, 4, 3, 3, gen=gen).float()  # [B1, B2, T, H, d, d]
    ref = loop_reference(X.flatten(0, 1), None).unflatten(0, (2, 3))
    for strategy in STRATEGIES:
        torch.testing.assert_close(mru_scan(X, None, strategy), ref, rtol=1e-5, atol=1e-5)


# -- depth: the parallel scans take O(log T) sequential steps ---------------------------------


@pytest.mark.parametrize("T", [1, 2, 3, 7, 8, 9, 64, 100, 1000, 16384], ids=lambda t: f"T{t}")
def test_sequential_steps_are_logarithmic(T: int):
    log = math.ceil(math.log2(T)) if T > 1 else 0
    assert count_steps("sequential", T) == (T - 1, T - 1)
    hs_steps, hs_work = count_steps("hillis_steele", T)
    sk_steps, sk_work = count_steps("sklansky", T)
    bk_steps, bk_work = count_steps("brent_kung", T)
    assert hs_steps == log and sk_steps == log
    assert bk_steps <= 2 * log
    assert bk_work <= 2 * T  # work-efficient
    assert sk_work <= T * log / 2 + T  # about half of Hillis–Steele's
    assert hs_work <= T * log


@pytest.mark.parametrize("T", [1, 2, 5, 6, 7, 8, 13, 33], ids=lambda t: f"T{t}")
@pytest.mark.parametrize("name", list(ALGORITHMS))
def test_generic_scan_keeps_order(name: str, T: int):
    # a non-commutative combine on 2x2 integer matrices: exact equality with a running product
    gen = torch.Generator().manual_seed(T)
    y = torch.randint(-1, 2, (T, 2, 2), generator=gen).double()
    expect, acc = [], torch.eye(2, dtype=torch.float64)
    for t in range(T):
        acc = acc @ y[t]
        expect.append(acc)
    y_before = y.clone()
    out = get_algorithm(name)(y, lambda a, b: a @ b)
    assert torch.equal(out, torch.stack(expect))
    assert torch.equal(y, y_before), "the scan wrote into its input without inplace=True"


# -- bad input --------------------------------------------------------------------------------


def test_non_square_x_names_sizes():
    X = torch.randn(1, 4, 2, 3, 2)
    with pytest.raises(ValueError, match=r"3 x 2"):
        mru_scan(X, None, "brent_kung")


def test_wrong_state_shape_names_sizes():
    X = torch.randn(1, 4, 2, 3, 3)
    with pytest.raises(ValueError, match=r"\(1, 2, 2, 2\).*\(1, 2, 3, 3\)"):
        mru_scan(X, torch.randn(1, 2, 2, 2), "sklansky")


def test_unknown_strategy_and_empty_time():
    with pytest.raises(ValueError, match="hillis_steele"):
        cumprod(torch.randn(3, 2, 2), None, "hillis")
    with pytest.raises(ValueError, match="T=0"):
        cumprod(torch.randn(0, 2, 2), None, "sklansky")
    with pytest.raises(ValueError, match=r"\[B, T, H, d, d\]"):
        mru_scan(torch.randn(3, 2, 2), None, "sklansky")


def test_functions_registry_covers_every_algorithm():
    assert set(FUNCTIONS) == set(ALGORITHMS)
