"""The miras knobs against hand-written loops of the MIRAS equations (float64)."""

import pytest
import torch

import atlas_core as ac
from atlas_core.errors import SpecError, StrategyError


def _call(B=2, T=6, H=2, D=3, seed=0):
    g = torch.Generator().manual_seed(seed)
    q = torch.nn.functional.normalize(torch.randn(B, T, H, D, generator=g, dtype=torch.float64), dim=-1)
    k = torch.nn.functional.normalize(torch.randn(B, T, H, D, generator=g, dtype=torch.float64), dim=-1)
    v = torch.randn(B, T, H, D, generator=g, dtype=torch.float64)
    alpha = 0.6 + 0.4 * torch.rand(B, T, H, generator=g, dtype=torch.float64)
    theta = 0.1 + 0.4 * torch.rand(B, T, H, generator=g, dtype=torch.float64)
    return q, k, v, alpha, theta


@pytest.mark.parametrize("p", [1.5, 3.0, 4.0])
def test_lp_error_is_the_derivative_of_its_loss(p):
    from atlas_miras.lp import LpBias

    bias = LpBias(p=p, eps=1e-6)
    pred = torch.randn(4, 5, dtype=torch.float64, requires_grad=True)
    v = torch.randn(4, 5, dtype=torch.float64)
    (grad,) = torch.autograd.grad(bias.loss(pred, v).sum(), pred)
    torch.testing.assert_close(bias.error(pred, v), grad, rtol=1e-12, atol=1e-12)
    e = (pred - v).detach()  # far from 0 the smoothing is invisible: sign(e) |e|^(p-1)
    far = e.abs() > 0.1
    exact = torch.sign(e) * e.abs() ** (p - 1)
    torch.testing.assert_close(bias.error(pred, v).detach()[far], exact[far], rtol=1e-4, atol=1e-6)


@pytest.mark.parametrize("mode", ["elementwise", "norm"])
def test_huber_error_is_the_derivative_of_its_loss(mode):
    from atlas_miras.huber import HuberBias

    bias = HuberBias(delta=0.7, mode=mode)
    pred = (2 * torch.randn(6, 4, dtype=torch.float64)).requires_grad_(True)
    v = torch.randn(6, 4, dtype=torch.float64)
    (grad,) = torch.autograd.grad(bias.loss(pred, v).sum(), pred)
    torch.testing.assert_close(bias.error(pred, v), grad, rtol=1e-12, atol=1e-12)
    e = (pred - v).detach()
    if mode == "elementwise":
        assert torch.equal(bias.error(pred, v).detach(), e.clamp(-0.7, 0.7))
    else:
        norms = bias.error(pred, v).detach().norm(dim=-1)
        assert torch.all(norms <= 0.7 + 1e-12)


def test_moneta_matches_the_accumulator_loop_of_eq_24():
    p, q_exp = 3.0, 2.5
    rule = ac.build_rule({"use": "miras:moneta", "bias": {"use": "miras:lp", "p": p, "eps": 0.0},
                          "retention": {"use": "miras:lq", "q": q_exp}})
    q, k, v, alpha, theta = _call()
    y, state = rule(q, k, v, gates={"alpha": alpha, "theta": theta}, strategy="core:sequential")
    B, T, H, D = q.shape
    A = torch.zeros(B, H, D, D, dtype=torch.float64)
    M = torch.zeros_like(A)
    ys = []
    for t in range(T):
        kt, vt, qt = k[:, t], v[:, t], q[:, t]  # [B, H, D]
        e = torch.einsum("bhvp,bhp->bhv", M, kt) - vt
        g = torch.einsum("bhv,bhp->bhvp", torch.sign(e) * e.abs() ** (p - 1), kt)
        A = alpha[:, t, :, None, None] * A - theta[:, t, :, None, None] * g
        norm = A.abs().pow(q_exp).sum(dim=(-1, -2), keepdim=True).pow(1 / q_exp)
        M = A / norm ** (q_exp - 2)
        ys.append(torch.einsum("bhvp,bhp->bhv", M, qt))
    torch.testing.assert_close(y, torch.stack(ys, dim=1), rtol=1e-10, atol=1e-10)
    torch.testing.assert_close(state["M"], M, rtol=1e-10, atol=1e-10)


def _memora_loop(q, k, v, alpha, theta, c, read, axis="row"):
    """MIRAS Eq 27 written out (float64): M_0 the centre of the scaled simplex, then per token
    M_t = c softmax(alpha_t log(M_{t-1} / c) - theta_t g_t), g_t = (M_{t-1} k_t - v_t) k_t^T."""
    B, T, H, D = q.shape
    Dv = v.shape[-1]
    n = D if axis == "row" else Dv * D
    M = torch.full((B, H, Dv, D), c / n, dtype=torch.float64)
    ys = []
    for t in range(T):
        if read == "before":
            ys.append(torch.einsum("bhvp,bhp->bhv", M, q[:, t]))
        e = torch.einsum("bhvp,bhp->bhv", M, k[:, t]) - v[:, t]
        g = torch.einsum("bhv,bhp->bhvp", e, k[:, t])
        logits = alpha[:, t, :, None, None] * torch.log(M / c) - theta[:, t, :, None, None] * g
        if axis == "row":
            M = c * torch.softmax(logits, dim=-1)
        else:
            M = c * torch.softmax(logits.flatten(2), dim=-1).reshape(logits.shape)
        if read == "after":
            ys.append(torch.einsum("bhvp,bhp->bhv", M, q[:, t]))
    return torch.stack(ys, dim=1), M


@pytest.mark.parametrize("c,read,axis", [(1.0, "after", "row"), (2.0, "after", "row"),
                                         (1.0, "before", "row"), (2.0, "before", "row"),
                                         (2.0, "before", "matrix")])
def test_memora_matches_the_softmax_loop_of_eq_27_from_the_uniform_start(c, read, axis):
    rule = ac.build_rule({"use": "miras:memora", "read": read,
                          "retention": {"use": "miras:kl", "scale": c, "axis": axis}})
    q, k, v, alpha, theta = _call(seed=3)
    y, state = rule(q, k, v, gates={"alpha": alpha, "theta": theta}, strategy="core:sequential")
    want_y, want_M = _memora_loop(q, k, v, alpha, theta, c, read, axis)
    torch.testing.assert_close(y, want_y, rtol=1e-10, atol=1e-10)
    torch.testing.assert_close(state["M"], want_M, rtol=1e-10, atol=1e-10)
    assert torch.all(state["M"] >= 0)
    sums = state["M"].sum(-1) if axis == "row" else state["M"].sum((-1, -2))
    torch.testing.assert_close(sums, torch.full_like(sums, c))


@pytest.mark.parametrize("c", [1.0, 2.0])
def test_memora_starts_at_the_centre_of_the_simplex_not_at_zero(c):
    B, H, D = 2, 2, 3
    rule = ac.build_rule({"use": "miras:memora", "read": "before",
                          "retention": {"use": "miras:kl", "scale": c}}, heads=H, d_key=D, d_value=D)
    M0 = rule.init_state(B, dtype=torch.float64)["M"]
    assert torch.equal(M0, torch.full((B, H, D, D), c / D, dtype=torch.float64))
    # read before the first write: the first output is the uniform memory's, (c / D) sum(q)
    q, k, v, alpha, theta = _call(B=B, H=H, D=D, seed=4)
    y, _ = rule(q, k, v, gates={"alpha": alpha, "theta": theta})
    torch.testing.assert_close(y[:, 0], (c / D) * q[:, 0].sum(-1, keepdim=True).expand(B, H, D),
                               rtol=1e-12, atol=1e-12)
    assert y[:, 0].abs().max() > 1e-3  # the zero memory would read exactly 0 here


def test_matrix_axis_starts_uniform_over_the_whole_weight():
    rule = ac.build_rule({"use": "miras:memora", "retention": {"use": "miras:kl", "scale": 3.0, "axis": "matrix"}},
                         heads=1, d_key=2, d_value=3)
    M0 = rule.init_state(1, dtype=torch.float64)["M"]
    assert torch.equal(M0, torch.full((1, 1, 3, 2), 0.5, dtype=torch.float64))


def test_lq_hooks_invert_each_other():
    from atlas_miras.lq import LqRetention

    W = {"M": torch.randn(2, 3, 4, 5, dtype=torch.float64)}
    for qq in (1.5, 2.5, 4.0):
        r = LqRetention(qq)
        torch.testing.assert_close(r.pre(r.post(W))["M"], W["M"], rtol=1e-12, atol=1e-12)
        zero = {"M": torch.zeros(1, 1, 2, 2, dtype=torch.float64)}
        assert torch.equal(r.post(zero)["M"], zero["M"]) and torch.equal(r.pre(zero)["M"], zero["M"])


def test_chunkwise_refuses_a_per_token_nonlinear_retention_above_chunk_one_with_its_reason():
    rule = ac.build_rule("miras:memora")
    q, k, v, alpha, theta = _call(T=4)
    with pytest.raises(StrategyError, match=r"chunk_size=2 .*per-token one \(anchor = 1\)"):
        rule(q, k, v, gates={"alpha": alpha, "theta": theta}, strategy={"use": "core:chunkwise", "chunk_size": 2})


def test_chunkwise_runs_moneta_at_q_2_exactly_like_sequential():
    rule = ac.build_rule({"use": "miras:moneta", "retention": {"use": "miras:lq", "q": 2.0}})
    q, k, v, alpha, theta = _call(T=5)
    gates = {"alpha": alpha, "theta": theta}
    y1, s1 = rule(q, k, v, gates=gates, strategy="core:sequential")
    y2, s2 = rule(q, k, v, gates=gates, strategy={"use": "core:chunkwise", "chunk_size": 1})
    torch.testing.assert_close(y1, y2, rtol=1e-10, atol=1e-10)
    torch.testing.assert_close(s1["M"], s2["M"], rtol=1e-10, atol=1e-10)


@pytest.mark.parametrize("bad, where", [
    ({"bias": {"use": "miras:lp", "p": 1.5, "eps": 0.0}}, "bias"),
    ({"retention": {"use": "miras:lq", "q": 3.0}}, "retention.q"),
    ({"bias": {"use": "miras:huber", "delta": 0.0}}, "bias.delta"),
    ({"retention": {"use": "miras:kl", "axis": "column"}}, "retention.axis"),
])
def test_bad_params_are_spec_errors_with_their_path(bad, where):
    with pytest.raises(SpecError, match=where):
        ac.build_rule({"use": "miras:moneta", **bad})
