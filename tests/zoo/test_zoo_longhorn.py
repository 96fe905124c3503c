"""``zoo:longhorn`` (Liu et al. 2024) against a hand-written float64 loop of the paper's update

    eps_t = theta_t / (1 + theta_t k_t^T k_t),  M_t = M_{t-1} (I - eps_t k_t k_t^T) + eps_t v_t k_t^T,
    y_t = M_t q_t

under every strategy that accepts it (core:exact_chunk among them), at chunk sizes 1, 5 and 16, in
one call and in three. Keys are not normalised here, so the normalisation is exercised.
"""

from __future__ import annotations

import torch

import atlas_core as ac
from atlas_core.components.l2 import L2Bias
from atlas_core.host.manager import get_registry
from atlas_core.knobs.gates import Gate
from atlas_core.rule import ComposedRule

from .strategies import accepting

B, T, H, D = 2, 30, 2, 5
TOL = 1e-10




def _inputs(seed=0):
    g = torch.Generator().manual_seed(seed)
    q, k, v = (torch.randn(B, T, H, D, generator=g, dtype=torch.float64) for _ in range(3))
    theta = 0.2 + 2.0 * torch.rand(B, T, H, generator=g, dtype=torch.float64)  # large steps: eps << theta
    return q, k, v, theta


def _paper_loop(q, k, v, theta, M0):
    M, ys = M0.clone(), []
    eye = torch.eye(D, dtype=torch.float64)
    for t in range(T):
        kt, vt, qt, bt = k[:, t], v[:, t], q[:, t], theta[:, t]  # [B, H, D], [B, H]
        eps = bt / (1.0 + bt * (kt * kt).sum(-1))
        kkT = kt[..., :, None] * kt[..., None, :]
        M = M @ (eye - eps[..., None, None] * kkT) + eps[..., None, None] * vt[..., :, None] * kt[..., None, :]
        ys.append(torch.einsum("bhvk,bhk->bhv", M, qt))
    return torch.stack(ys, 1), M


def test_longhorn_equals_the_papers_update_under_every_strategy():
    q, k, v, theta = _inputs(1)
    M0 = 0.3 * torch.randn(B, H, D, D, generator=torch.Generator().manual_seed(3), dtype=torch.float64)
    y_ref, M_ref = _paper_loop(q, k, v, theta, M0)
    rule = ac.build_rule("zoo:longhorn", heads=H, d_key=D, d_value=D)
    ran = []
    for strategy in accepting(rule):
        with torch.no_grad():
            y, st = rule(q, k, v, gates={"theta": theta}, state={"M": M0}, strategy=strategy)
            ys, s = [], {"M": M0}
            for a, b in ((0, 4), (4, 17), (17, T)):
                yy, s = rule(q[:, a:b], k[:, a:b], v[:, a:b], gates={"theta": theta[:, a:b]}, state=s,
                             strategy=strategy)
                ys.append(yy)
        torch.testing.assert_close(y, y_ref, rtol=TOL, atol=TOL, msg=lambda m: f"{strategy}: {m}")
        torch.testing.assert_close(st["M"], M_ref, rtol=TOL, atol=TOL)
        torch.testing.assert_close(torch.cat(ys, 1), y_ref, rtol=TOL, atol=TOL)
        torch.testing.assert_close(s["M"], M_ref, rtol=TOL, atol=TOL)
        ran.append(strategy)
    assert any(isinstance(s, dict) and s["use"] == "core:exact_chunk" for s in ran), ran


def test_the_step_is_normalised_and_differs_from_deltanet():
    """With the same theta the plain delta rule is another function; with a large theta Longhorn
    stays bounded (eps |k|^2 < 1: the key's direction is overwritten, never overshot)."""
    q, k, v, theta = _inputs(2)
    big = 50.0 * theta
    lh = ac.build_rule("zoo:longhorn", heads=H, d_key=D, d_value=D)
    dn = ac.build_rule("zoo:deltanet", heads=H, d_key=D, d_value=D)
    with torch.no_grad():
        y1, s1 = lh(q, k, v, gates={"theta": big})
        y2, _ = dn(q, k, v, gates={"theta": theta})
        y3, _ = lh(q, k, v, gates={"theta": theta})
    assert (y3 - y2).abs().max() > 1e-2
    assert torch.isfinite(s1["M"]).all() and s1["M"].abs().max() < 1e3
    # after one token with a huge theta the memory maps k to (almost) v: M k = eps |k|^2 v
    y, st = lh(q[:, :1], k[:, :1], v[:, :1], gates={"theta": torch.full((B, 1, H), 1e8, dtype=torch.float64)})
    torch.testing.assert_close(torch.einsum("bhvk,bhk->bhv", st["M"], k[:, 0]), v[:, 0], rtol=1e-6, atol=1e-6)


class _OldStyleWeight(L2Bias):
    """A bias written before ``weight_reads_key``: its weight takes (gates, like) only."""

    gates = (Gate("rho", bias=0.0),)

    def weight(self, gates, like):
        return gates["rho"]


def test_a_bias_that_does_not_declare_the_key_is_called_without_it():
    reg = get_registry()
    parts = [reg.build(kind, name) for kind, name in (("structure", "core:linear"), ("retention", "core:none"),
                                                      ("algorithm", "core:gd"), ("feature_map", "core:identity"))]
    rule = ComposedRule(parts[0], _OldStyleWeight(), parts[1], parts[2], parts[3])
    q, k, v, theta = _inputs(3)
    rho = torch.rand(B, T, H, dtype=torch.float64)
    with torch.no_grad():
        y, _ = rule(q, k, v, gates={"theta": theta, "rho": rho})
        ref = ac.build_rule("zoo:deltanet", heads=H, d_key=D, d_value=D)
        y_ref, _ = ref(q, k, v, gates={"theta": theta * rho})
    torch.testing.assert_close(y, y_ref, rtol=1e-12, atol=1e-12)


def test_an_omega_window_forwards_the_key_to_a_normalised_bias():
    """omega:window around zoo:normalized_l2 with c = 1 is zoo:longhorn (the window hands the key
    on); with c = 3 every strategy that accepts it equals the sequential loop."""
    q, k, v, theta = _inputs(4)
    lh = ac.build_rule("zoo:longhorn", heads=H, d_key=D, d_value=D)
    win = {"use": "zoo:longhorn", "bias": {"use": "omega:window", "inner": "zoo:normalized_l2", "window": 1,
                                            "gamma": "decay"}}
    one = ac.build_rule(win, heads=H, d_key=D, d_value=D)
    assert one.bias.weight_reads_key
    with torch.no_grad():
        y1, _ = lh(q, k, v, gates={"theta": theta})
        y2, _ = one(q, k, v, gates={"theta": theta})
    torch.testing.assert_close(y2, y1, rtol=1e-12, atol=1e-12)
    three = ac.build_rule({**win, "bias": {**win["bias"], "window": 3}}, heads=H, d_key=D, d_value=D)
    with torch.no_grad():
        ref, _ = three(q, k, v, gates={"theta": theta}, strategy="core:sequential")
        fast, _ = three(q, k, v, gates={"theta": theta}, strategy={"use": "core:exact_chunk", "chunk_size": 7})
    torch.testing.assert_close(fast, ref, rtol=1e-10, atol=1e-10)
    assert (ref - y1).abs().max() > 1e-3
