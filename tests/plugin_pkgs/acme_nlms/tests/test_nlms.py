"""The preset against a hand-written float64 loop of its equation, under every strategy that
accepts it (core:exact_chunk among them), in one call and in two:

    eps_t = theta_t mu_t / (delta + |k_t|^2),  M_t = alpha_t M_{t-1} - eps_t (M_{t-1} k_t - v_t) k_t^T
"""

import torch

import atlas_core as ac
from atlas_core.errors import StrategyError

B, T, H, D = 2, 20, 2, 4


def _loop(q, k, v, alpha, theta, mu, delta):
    M, ys = torch.zeros(B, H, D, D, dtype=torch.float64), []
    for t in range(T):
        kt = k[:, t]
        eps = theta[:, t] * mu[:, t] / (delta + (kt * kt).sum(-1))
        err = torch.einsum("bhvk,bhk->bhv", M, kt) - v[:, t]
        M = alpha[:, t, :, None, None] * M - eps[..., None, None] * err[..., :, None] * kt[..., None, :]
        ys.append(torch.einsum("bhvk,bhk->bhv", M, q[:, t]))
    return torch.stack(ys, 1), M


def test_nlms_delta_equals_its_equation():
    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(B, T, H, D, generator=g, dtype=torch.float64) for _ in range(3))
    gates = {"alpha": 0.8 + 0.2 * torch.rand(B, T, H, generator=g, dtype=torch.float64),
             "theta": torch.rand(B, T, H, generator=g, dtype=torch.float64),
             "mu": 2.0 * torch.rand(B, T, H, generator=g, dtype=torch.float64)}
    rule = ac.build_rule({"use": "acme_nlms:nlms_delta", "bias": {"use": "acme_nlms:nlms", "delta": 0.5}},
                         heads=H, d_key=D, d_value=D)
    y_ref, M_ref = _loop(q, k, v, gates["alpha"], gates["theta"], gates["mu"], 0.5)
    ran = []
    for strategy in ("core:sequential", {"use": "core:exact_chunk", "chunk_size": 8},
                     {"use": "core:chunkwise", "chunk_size": 1}):
        try:
            rule.runner(strategy)
        except StrategyError:
            continue
        with torch.no_grad():
            y, st = rule(q, k, v, gates=gates, strategy=strategy)
            y1, s = rule(q[:, :9], k[:, :9], v[:, :9], gates={n: x[:, :9] for n, x in gates.items()},
                         strategy=strategy)
            y2, s = rule(q[:, 9:], k[:, 9:], v[:, 9:], gates={n: x[:, 9:] for n, x in gates.items()},
                         state=s, strategy=strategy)
        torch.testing.assert_close(y, y_ref, rtol=1e-10, atol=1e-10)
        torch.testing.assert_close(st["M"], M_ref, rtol=1e-10, atol=1e-10)
        torch.testing.assert_close(torch.cat([y1, y2], 1), y_ref, rtol=1e-10, atol=1e-10)
        ran.append(strategy)
    assert {"use": "core:exact_chunk", "chunk_size": 8} in ran, ran
    assert rule.gate_names == ("alpha", "mu", "theta")
