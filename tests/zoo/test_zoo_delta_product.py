"""``zoo:gated_delta_product`` (Siems et al. 2025) against fla-core 0.6.0's reference loop
(``fla/ops/gated_delta_product/naive.py``, loaded by file path), under every strategy that accepts
it, for n = 2 and 3 Householder steps per token, in one call and in three.

Map (docs/zoo.md): fla's ``k, v: [B, T n, H, D]`` and ``beta: [B, T n, H]`` are ours viewed as
``[B, T, n, H, D]`` and ``[B, T, n, H]`` (sub-step j of token t at fla position ``t n + j``);
``alpha = exp(g)`` per token; ``scale = 1``; our ``M = S^T``. fla computes in float32.
"""

from __future__ import annotations

import pytest
import torch

import atlas_core as ac
from atlas_core.errors import SpecError

from ..fla_refs import fla_reference
from .strategies import accepting

B, T, H, D = 2, 24, 2, 6
TOL = 2e-5




def _inputs(n, seed=0, dtype=torch.float32):
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(B, T, H, D, generator=g, dtype=dtype)
    k = torch.nn.functional.normalize(torch.randn(B, T, n, H, D, generator=g, dtype=dtype), dim=-1)
    v = torch.randn(B, T, n, H, D, generator=g, dtype=dtype)
    alpha = 0.8 + 0.2 * torch.rand(B, T, H, generator=g, dtype=dtype)
    theta = 0.1 + 0.9 * torch.rand(B, T, n, H, generator=g, dtype=dtype)
    return q, k, v, alpha, theta


@pytest.mark.parametrize("n", [2, 3])
def test_gated_delta_product_equals_fla_under_every_strategy(n):
    ref = fla_reference("ops/gated_delta_product/naive.py")
    q, k, v, alpha, theta = _inputs(n, seed=n)
    S0 = 0.3 * torch.randn(B, H, D, D, generator=torch.Generator().manual_seed(9))
    y_ref, S_ref = ref.naive_recurrent_gated_delta_product(
        q, k.flatten(1, 2), v.flatten(1, 2), alpha.log(), theta.flatten(1, 2), scale=1.0,
        initial_state=S0.clone(), output_final_state=True, num_householder=n)
    rule = ac.build_rule({"use": "zoo:gated_delta_product", "steps_per_token": n}, heads=H, d_key=D, d_value=D)
    gates = {"alpha": alpha, "theta": theta}
    state0 = {"M": S0.transpose(-1, -2)}
    ran = []
    for strategy in accepting(rule):
        with torch.no_grad():
            y, st = rule(q, k, v, gates=gates, state=state0, strategy=strategy)
            ys, s = [], state0
            for a, b in ((0, 7), (7, 8), (8, T)):
                yy, s = rule(q[:, a:b], k[:, a:b], v[:, a:b], gates={m: x[:, a:b] for m, x in gates.items()},
                             state=s, strategy=strategy)
                ys.append(yy)
        scale = max(1.0, float(y_ref.abs().max()))
        torch.testing.assert_close(y, y_ref, rtol=TOL, atol=TOL * scale, msg=lambda m: f"{strategy}: {m}")
        torch.testing.assert_close(st["M"], S_ref.transpose(-1, -2), rtol=TOL, atol=TOL * scale)
        torch.testing.assert_close(torch.cat(ys, 1), y, rtol=TOL, atol=TOL * scale)
        ran.append(strategy)
    assert any(isinstance(s, dict) and s["use"] == "core:exact_chunk" for s in ran), ran


def test_one_step_per_token_is_gated_deltanet_and_more_steps_differ():
    q, k, v, alpha, theta = _inputs(1, seed=4, dtype=torch.float64)
    one = ac.build_rule({"use": "zoo:gated_delta_product", "steps_per_token": 1}, heads=H, d_key=D, d_value=D)
    gdn = ac.build_rule("zoo:gated_deltanet", heads=H, d_key=D, d_value=D)
    with torch.no_grad():
        y1, s1 = one(q, k[:, :, 0], v[:, :, 0], gates={"alpha": alpha, "theta": theta[:, :, 0]})
        y2, s2 = gdn(q, k[:, :, 0], v[:, :, 0], gates={"alpha": alpha, "theta": theta[:, :, 0]})
    assert torch.equal(y1, y2) and torch.equal(s1["M"], s2["M"])
    q, k, v, alpha, theta = _inputs(2, seed=4, dtype=torch.float64)
    two = ac.build_rule("zoo:gated_delta_product", heads=H, d_key=D, d_value=D)
    with torch.no_grad():
        y3, _ = two(q, k, v, gates={"alpha": alpha, "theta": theta})
    assert (y3 - y2).abs().max() > 1e-3  # the second step changes the function


def test_hand_written_loop_with_read_before():
    """read = "before": the token's output is the read before its decay and its steps."""
    n = 2
    q, k, v, alpha, theta = _inputs(n, seed=6, dtype=torch.float64)
    rule = ac.build_rule({"use": "zoo:gated_delta_product", "read": "before"}, heads=H, d_key=D, d_value=D)
    with torch.no_grad():
        y, st = rule(q, k, v, gates={"alpha": alpha, "theta": theta})
    M = torch.zeros(B, H, D, D, dtype=torch.float64)
    ys = []
    for t in range(T):
        ys.append(torch.einsum("bhvk,bhk->bhv", M, q[:, t]))
        M = alpha[:, t, :, None, None] * M
        for j in range(n):
            kk, vv, th = k[:, t, j], v[:, t, j], theta[:, t, j]
            err = torch.einsum("bhvk,bhk->bhv", M, kk) - vv
            M = M - th[..., None, None] * err[..., :, None] * kk[..., None, :]
    torch.testing.assert_close(y, torch.stack(ys, 1), rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(st["M"], M, rtol=1e-12, atol=1e-12)


def test_steps_per_token_is_validated_and_shapes_are_named():
    for bad in (0, 2.5, True, "2", 65):
        with pytest.raises(SpecError) as exc:
            ac.build_rule({"use": "zoo:gated_delta_product", "steps_per_token": bad})
        assert len(exc.value.issues) == 1 and exc.value.issues[0].path == "steps_per_token"
    with pytest.raises(SpecError, match="steps_per_token"):
        ac.build_rule({"use": "zoo:rwkv7", "steps_per_token": 2})
    with pytest.raises(SpecError, match="standalone"):
        ac.build_rule({"use": "mru:mru", "steps_per_token": 2})
    rule = ac.build_rule("zoo:gated_delta_product", heads=H, d_key=D, d_value=D)
    q, k, v, alpha, theta = _inputs(2)
    with pytest.raises(ValueError, match=r"k must have 5 dimensions \[B, T, n, H, D\]"):
        rule(q, k.flatten(1, 2), v, gates={"alpha": alpha, "theta": theta})
    with pytest.raises(ValueError, match="per sub-step"):
        rule(q, k, v, gates={"alpha": alpha, "theta": theta[:, :, 0]})
    with pytest.raises(ValueError, match="per token"):
        rule(q, k, v, gates={"alpha": theta, "theta": theta})


def test_memory_layer_makes_n_keys_values_and_thetas_per_token():
    from atlas_core.layer import LayerParams, MemoryLayer

    torch.manual_seed(0)
    rule = ac.build_rule({"use": "zoo:gated_delta_product", "steps_per_token": 3})
    layer = MemoryLayer(12, 2, rule, LayerParams(conv_size=3), strategy="core:sequential").double()
    assert layer.k_proj.out_features == 3 * 12 and layer.v_proj.out_features == 3 * 12
    x = torch.randn(2, 10, 12, dtype=torch.float64)
    gates = layer.gates(x)
    assert gates["theta"].shape == (2, 10, 3, 2) and gates["alpha"].shape == (2, 10, 2)
    y, st = layer(x)
    y1, s = layer(x[:, :4])
    y2, s = layer(x[:, 4:], s)
    torch.testing.assert_close(torch.cat([y1, y2], 1), y, rtol=1e-10, atol=1e-10)
    torch.testing.assert_close(s["rule.M"], st["rule.M"], rtol=1e-10, atol=1e-10)


def test_input_checks_name_the_step_axis():
    """`check_inputs=True` places a bad value of a per-step tensor on its step axis."""
    from atlas_core.input_checks import InputCheckError

    rule = ac.build_rule({"use": "zoo:gated_delta_product"}, heads=2, d_key=4, d_value=4)
    q = torch.randn(1, 5, 2, 4)
    k, v = torch.randn(1, 5, 2, 2, 4), torch.randn(1, 5, 2, 2, 4)
    theta = torch.rand(1, 5, 2, 2)
    theta[0, 3, 1, 1] = float("nan")
    with pytest.raises(InputCheckError, match=r"at \(batch 0, time 3, step 1, head 1\)"):
        rule(q, k, v, gates={"alpha": torch.rand(1, 5, 2), "theta": theta}, check_inputs=True)
