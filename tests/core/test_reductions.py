"""docs/math.md "Reductions that tests must check", for the core knobs."""

import torch

import atlas_core as ac

from .conftest import make_inputs


def test_momentum_with_eta_zero_equals_gd():
    q, k, v, gates = make_inputs()
    g0 = {**gates, "eta": torch.zeros_like(gates["eta"])}
    for anchor, strategy in [(1, "core:sequential"), (4, "core:sequential"),
                             (4, {"use": "core:chunkwise", "chunk_size": 4})]:
        mom = ac.build_rule({"algorithm": "core:momentum", "retention": "core:decay", "anchor": anchor})
        gd = ac.build_rule({"algorithm": "core:gd", "retention": "core:decay", "anchor": anchor})
        y1, s1 = mom(q, k, v, gates=g0, strategy=strategy)
        y2, s2 = gd(q, k, v, gates={"alpha": gates["alpha"], "theta": gates["theta"]}, strategy=strategy)
        torch.testing.assert_close(y1, y2, atol=1e-12, rtol=0)
        for key in s2:  # M and, anchored, the block position and anchor memory
            torch.testing.assert_close(s1[key], s2[key], atol=1e-12, rtol=0)


def test_linear_l2_gd_is_deltanet():
    """M_t = M_{t-1} (I - theta k k^T) + theta v k^T, read after."""
    q, k, v, gates = make_inputs()
    rule = ac.build_rule({"bias": "core:l2", "algorithm": "core:gd", "retention": "core:none"})
    y, s = rule(q, k, v, gates={"theta": gates["theta"]})
    B, T, H, Dk = k.shape
    M = torch.zeros(B, H, v.shape[-1], Dk, dtype=torch.float64)
    eye = torch.eye(Dk, dtype=torch.float64)
    for t in range(T):
        kt, vt, th = k[:, t], v[:, t], gates["theta"][:, t, :, None, None]
        M = M @ (eye - th * kt[..., :, None] * kt[..., None, :]) + th * vt[..., :, None] * kt[..., None, :]
        torch.testing.assert_close(y[:, t], torch.einsum("bhvk,bhk->bhv", M, q[:, t]), atol=1e-12, rtol=0)
    torch.testing.assert_close(s["M"], M, atol=1e-12, rtol=0)


def test_linear_dot_no_retention_theta_one_is_linear_attention():
    """M_t = M_{t-1} + v_t k_t^T, so y_t = sum_{i<=t} (q_t . k_i) v_i."""
    q, k, v, gates = make_inputs()
    rule = ac.build_rule({"bias": "core:dot", "algorithm": "core:gd", "retention": "core:none"})
    ones = torch.ones_like(gates["theta"])
    for strategy in ["core:sequential", {"use": "core:chunkwise", "chunk_size": 4}]:
        y, _ = rule(q, k, v, gates={"theta": ones}, strategy=strategy)
        scores = torch.einsum("bthd,bshd->bhts", q, k).tril()
        ref = torch.einsum("bhts,bshv->bthv", scores, v)
        torch.testing.assert_close(y, ref, atol=1e-12, rtol=0)
