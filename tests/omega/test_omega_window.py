"""``omega:window`` under ``core:sequential`` against a hand-written loop of Atlas Eq 9 (docs/math.md).

The loop below is written from docs/math.md only: for each token t,
``g_t = sum_{i=max(0,t-c+1)}^{t} gamma_i * lag[t-i] * (M_{t-1} phi(k_i) - v_i) phi(k_i)^T``, then
gd (``M_t = alpha_t M_{t-1} - theta_t g_t``) or momentum (``Z_t = eta_t Z_{t-1} + theta_t g_t``,
``M_t = alpha_t M_{t-1} - Z_t``), read ``y_t = M_t phi(q_t)`` (after) or ``M_{t-1} phi(q_t)``
(before).
"""

from itertools import product

import pytest
import torch

import atlas_core as ac

from .conftest import gates_for, make_inputs, window_rule

DECAY = 0.7


def lag_of(mode, c):
    """Weights by distance back in the window, as docs/omega.md defines them."""
    if mode == "uniform":
        return [1.0 / c] * c
    if mode == "decay":
        return [DECAY**j for j in range(c)]
    return [1.0] * c


def eq9_loop(q, k, v, gates, c, mode, algorithm, read, phi=lambda x: x):
    """Atlas Eq 9 with l2 inner loss and linear memory, one token and one window term at a time."""
    B, T, H, _ = q.shape
    pk, pq = phi(k), phi(q)
    Dphi, Dv = pk.shape[-1], v.shape[-1]
    lag = lag_of(mode, c)
    M = torch.zeros(B, H, Dv, Dphi, dtype=q.dtype)
    Z = torch.zeros_like(M)
    ys = []
    for t in range(T):
        g = torch.zeros_like(M)
        for i in range(max(0, t - c + 1), t + 1):
            w = lag[t - i] * (gates["gamma"][:, i] if mode == "gate" else 1.0)  # [B, H] or float
            err = torch.einsum("bhvp,bhp->bhv", M, pk[:, i]) - v[:, i]  # M_{t-1} phi(k_i) - v_i
            grad = torch.einsum("bhv,bhp->bhvp", err, pk[:, i])
            g = g + (w[..., None, None] if torch.is_tensor(w) else w) * grad
        alpha = gates["alpha"][:, t, :, None, None]
        theta = gates["theta"][:, t, :, None, None]
        if algorithm == "core:gd":
            M_new = alpha * M - theta * g
        else:
            Z = gates["eta"][:, t, :, None, None] * Z + theta * g
            M_new = alpha * M - Z
        read_from = M_new if read == "after" else M
        ys.append(torch.einsum("bhvp,bhp->bhv", read_from, pq[:, t]))
        M = M_new
    return torch.stack(ys, dim=1), M, Z


CASES = list(product((1, 2, 4, 16), ("gate", "uniform", "decay"), ("core:gd", "core:momentum"),
                     ("after", "before")))


@pytest.mark.parametrize("c,mode,algorithm,read", CASES,
                         ids=[f"c{c}-{m}-{a.split(':')[1]}-{r}" for c, m, a, r in CASES])
def test_sequential_matches_eq9_loop(c, mode, algorithm, read):
    # T = 12 < 16: the c = 16 cases also cover a window longer than the whole sequence
    q, k, v, gates = make_inputs(T=12, seed=c)
    rule = window_rule(c, mode, algorithm, read, decay=DECAY if mode == "decay" else None)
    y, state = rule(q, k, v, gates=gates_for(rule, gates), strategy="core:sequential")
    y_ref, M_ref, Z_ref = eq9_loop(q, k, v, gates, c, mode, algorithm, read)
    torch.testing.assert_close(y, y_ref, atol=1e-10, rtol=0)
    torch.testing.assert_close(state["M"], M_ref, atol=1e-10, rtol=0)
    if algorithm == "core:momentum":
        torch.testing.assert_close(state["Z.M"], Z_ref, atol=1e-10, rtol=0)
    if c > 1:  # the carried window holds the last c - 1 inputs (zeros/gamma 0 before the start)
        n = min(c - 1, 12)
        assert torch.equal(state["window.k"][:, :, -n:], k[:, -n:].transpose(1, 2))
        assert torch.equal(state["window.v"][:, :, -n:], v[:, -n:].transpose(1, 2))
        want_gamma = gates["gamma"][:, -n:] if mode == "gate" else torch.ones(2, n, 2, dtype=q.dtype)
        assert torch.equal(state["window.gamma"][:, :, -n:], want_gamma.transpose(1, 2))
        assert torch.all(state["window.gamma"][:, :, : c - 1 - n] == 0)


def test_window_with_poly_map_matches_eq9_loop():
    q, k, v, gates = make_inputs(T=9, seed=3)
    rule = window_rule(3, "gate", "core:momentum",
                       feature_map={"use": "omega:poly", "degree": 3, "coefficients": "fixed"})
    y, state = rule(q, k, v, gates=gates_for(rule, gates))
    y_ref, M_ref, _ = eq9_loop(q, k, v, gates, 3, "gate", "core:momentum", "after",
                               phi=lambda x: x + x**2 + x**3)
    torch.testing.assert_close(y, y_ref, atol=1e-10, rtol=0)
    torch.testing.assert_close(state["M"], M_ref, atol=1e-10, rtol=0)


CHUNK4 = {"use": "core:chunkwise", "chunk_size": 4}


@pytest.mark.parametrize("inner", ["core:l2", "core:dot"])
@pytest.mark.parametrize("mode", ["gate", "uniform", "decay"])
@pytest.mark.parametrize("strategy,anchor", [("core:sequential", 1), ("core:sequential", 4), (CHUNK4, 4)],
                         ids=["sequential", "sequential-anchor4", "chunkwise4-anchor4"])
def test_window_one_with_unit_gamma_is_the_plain_bias_exactly(inner, mode, strategy, anchor):
    q, k, v, gates = make_inputs(T=10, seed=7)
    gates["gamma"] = torch.ones_like(gates["gamma"])
    omega = window_rule(1, mode, "core:momentum", inner=inner, decay=0.5 if mode == "decay" else None,
                        anchor=anchor)
    plain = ac.build_rule({"bias": inner, "retention": "core:decay", "algorithm": "core:momentum",
                           "anchor": anchor})
    y1, s1 = omega(q, k, v, gates=gates_for(omega, gates), strategy=strategy)
    y2, s2 = plain(q, k, v, gates=gates_for(plain, gates), strategy=strategy)
    assert torch.equal(y1, y2)
    anchored = {"anchor.pos", "anchor.M"} if anchor > 1 else set()
    assert set(s1) == set(s2) == {"M", "Z.M"} | anchored  # c = 1 carries no window
    assert all(torch.equal(s1[n], s2[n]) for n in s1)


def test_window_one_with_dot_inner_runs_any_chunk_at_anchor_one():
    """A one-token window around the dot bias has prediction-free gradients on linear memory, as
    the plain dot bias does: at anchor 1 chunkwise accepts C > 1 for both and equals sequential."""
    q, k, v, gates = make_inputs(T=10, seed=7)
    gates["gamma"] = torch.ones_like(gates["gamma"])
    omega = window_rule(1, "gate", "core:momentum", inner="core:dot")
    plain = ac.build_rule({"bias": "core:dot", "retention": "core:decay", "algorithm": "core:momentum"})
    for rule in (omega, plain):
        g = gates_for(rule, gates)
        y, s = rule(q, k, v, gates=g, strategy=CHUNK4)
        y_seq, s_seq = rule(q, k, v, gates=g, strategy="core:sequential")
        torch.testing.assert_close(y, y_seq, atol=1e-12, rtol=0)
        assert set(s) == set(s_seq) and all(torch.allclose(s[n], s_seq[n], atol=1e-12, rtol=0) for n in s)


@pytest.mark.parametrize("strategy,anchor", [("core:sequential", 1), ("core:sequential", 4), (CHUNK4, 4)],
                         ids=["sequential", "sequential-anchor4", "chunkwise4-anchor4"])
def test_token_with_zero_gamma_contributes_nothing(strategy, anchor):
    q, k, v, gates = make_inputs(T=14, seed=11)
    j = 5
    gates["gamma"][:, j] = 0.0
    rule = window_rule(4, "gate", "core:momentum", anchor=anchor)
    y, s = rule(q, k, v, gates=gates_for(rule, gates), strategy=strategy)
    k2, v2 = k.clone(), v.clone()
    k2[:, j] = torch.nn.functional.normalize(torch.randn_like(k2[:, j]), dim=-1)
    v2[:, j] = 10 * torch.randn_like(v2[:, j])
    y2, s2 = rule(q, k2, v2, gates=gates_for(rule, gates), strategy=strategy)
    assert torch.equal(y, y2)
    assert torch.equal(s["M"], s2["M"]) and torch.equal(s["Z.M"], s2["Z.M"])
    # and the same token with a nonzero gamma does change the memory
    gates["gamma"][:, j] = 0.5
    y3, _ = rule(q, k2, v2, gates=gates_for(rule, gates), strategy=strategy)
    assert (y3 - y).abs().max() > 1e-3


def test_uniform_weighting_is_the_window_mean():
    """uniform (1/c each) equals decay mode with decay = 1 (the sum) with theta divided by c."""
    c = 4
    q, k, v, gates = make_inputs(T=10, seed=5)
    uni = window_rule(c, "uniform")
    summed = window_rule(c, "decay", decay=1.0)
    y1, s1 = uni(q, k, v, gates=gates_for(uni, gates))
    g2 = dict(gates_for(summed, gates), theta=gates["theta"] / c)
    y2, s2 = summed(q, k, v, gates=g2)
    torch.testing.assert_close(y1, y2, atol=1e-12, rtol=0)
    torch.testing.assert_close(s1["M"], s2["M"], atol=1e-12, rtol=0)


def test_sequential_state_carry_with_window_crossing_the_split():
    c, T = 6, 13
    q, k, v, gates = make_inputs(T=T, seed=2)
    rule = window_rule(c, "gate", "core:momentum", read="before")
    g = gates_for(rule, gates)
    y, s = rule(q, k, v, gates=g)
    for split in (2, 7):  # 2 < c - 1: the second call still sees carried empty slots
        ya, sa = rule(q[:, :split], k[:, :split], v[:, :split],
                      gates={n: x[:, :split] for n, x in g.items()})
        yb, sb = rule(q[:, split:], k[:, split:], v[:, split:],
                      gates={n: x[:, split:] for n, x in g.items()}, state=sa)
        torch.testing.assert_close(torch.cat([ya, yb], dim=1), y, atol=1e-12, rtol=0)
        for name in s:
            torch.testing.assert_close(sb[name], s[name], atol=1e-12, rtol=0)
