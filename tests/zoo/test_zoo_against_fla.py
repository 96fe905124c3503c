"""Each zoo preset against flash-linear-attention's own reference loop for the same rule (fla-core
0.6.0, ``fla/ops/<rule>/naive.py``, loaded by file path), under ``core:sequential`` and under every
strategy that accepts it, at chunk sizes 1, 5 and 16, for a sequence run in one call and in three.

Map (docs/zoo.md): our ``M = S^T``; q as given (fla's ``scale`` is passed as 1, or q is divided by
fla's fixed ``1/sqrt(Dk)`` first); ``alpha = exp(g)``; ``theta`` = fla's ``beta`` (delta rule) or 1
(linear attention, RetNet, simple GLA, whose writes carry no strength). fla computes in float32,
so the comparison is at float32 accuracy.
"""

from __future__ import annotations


import pytest
import torch

import atlas_core as ac
from atlas_core.errors import StrategyError

from ..fla_refs import fla_reference
from .strategies import every_strategy

B, T, H, D = 2, 40, 3, 8
TOL = 2e-5



def _inputs(seed=0):
    g = torch.Generator().manual_seed(seed)
    q, k, v = (torch.randn(B, T, H, D, generator=g) for _ in range(3))
    k = torch.nn.functional.normalize(k, dim=-1)
    alpha = 0.8 + 0.2 * torch.rand(B, T, H, generator=g)
    beta = 0.1 + 0.8 * torch.rand(B, T, H, generator=g)
    return q, k, v, alpha, beta


_strategies = every_strategy


def _ours(preset, gates, q, k, v):
    """y: [B, T, H, D] and M: [B, H, D, D] of the preset under every strategy that accepts it,
    in one call and in three; all must agree with each other to float32 rounding."""
    rule = ac.build_rule({"use": preset}, heads=H, d_key=D, d_value=D)
    results, ran = [], []
    for strategy in _strategies():
        try:
            rule.runner(strategy)
        except StrategyError:
            continue
        with torch.no_grad():
            y, st = rule(q, k, v, gates=gates, strategy=strategy)
            ys, s = [], None
            for a, b in ((0, 7), (7, 23), (23, T)):
                yy, s = rule(q[:, a:b], k[:, a:b], v[:, a:b], gates={n: x[:, a:b] for n, x in gates.items()},
                             state=s, strategy=strategy)
                ys.append(yy)
        torch.testing.assert_close(torch.cat(ys, 1), y, rtol=TOL, atol=TOL)
        results.append((y, st["M"]))
        ran.append(strategy)
    assert len(ran) >= 2, f"{preset}: only {ran} ran it"
    return results, ran


def _check(results, y_ref, S_ref):
    scale = max(1.0, float(y_ref.abs().max()))
    for y, M in results:
        torch.testing.assert_close(y, y_ref, rtol=TOL, atol=TOL * scale)
        torch.testing.assert_close(M, S_ref.transpose(-1, -2), rtol=TOL, atol=TOL * scale)


def test_linear_attention_equals_fla():
    ref = fla_reference("ops/linear_attn/naive.py")
    q, k, v, _, _ = _inputs(1)
    y_ref = ref.naive_recurrent_linear_attn(q, k, v, scale=1.0)[0]
    # fla returns no final state here without output_final_state; rebuild it: S = sum k v^T
    S_ref = torch.einsum("bthk,bthv->bhkv", k, v)
    results, _ = _ours("zoo:linear_attention", {"theta": torch.ones(B, T, H)}, q, k, v)
    _check(results, y_ref, S_ref)


def test_simple_gla_equals_fla():
    ref = fla_reference("ops/simple_gla/naive.py")
    q, k, v, alpha, _ = _inputs(2)
    y_ref, S_ref = ref.naive_recurrent_simple_gla(q, k, v, alpha.log(), scale=1.0)
    results, _ = _ours("zoo:simple_gla", {"alpha": alpha, "theta": torch.ones(B, T, H)}, q, k, v)
    _check(results, y_ref, S_ref)


def test_retnet_equals_fla():
    ref = fla_reference("ops/retention/naive.py")
    q, k, v, _, _ = _inputs(3)
    # fla's naive_retention: [B, H, T, D] inputs, q scaled by 1/sqrt(D) inside, no final state
    y_ref = ref.naive_retention(*(x.transpose(1, 2) for x in (q, k, v))).transpose(1, 2) * D ** 0.5
    alpha = 1.0 - 2.0 ** (-5.0 - torch.arange(H, dtype=torch.float32))
    decay = alpha.view(1, H, 1, 1) ** (T - 1 - torch.arange(T, dtype=torch.float32)).view(1, 1, T, 1)
    S_ref = torch.einsum("bhtk,bhtv->bhkv", k.transpose(1, 2) * decay, v.transpose(1, 2))
    results, _ = _ours("zoo:retnet", {"theta": torch.ones(B, T, H)}, q, k, v)
    _check(results, y_ref, S_ref)


def test_deltanet_equals_fla():
    ref = fla_reference("ops/delta_rule/naive.py")
    q, k, v, _, beta = _inputs(4)
    # fla's delta_rule_recurrence: [B, H, T, D], q scaled by 1/sqrt(Dk) inside
    y_ref, S_ref = ref.delta_rule_recurrence(*(x.transpose(1, 2) for x in (q * D ** 0.5, k, v)),
                                             beta.transpose(1, 2))
    results, ran = _ours("zoo:deltanet", {"theta": beta}, q, k, v)
    assert any(isinstance(s, dict) and s["use"] == "core:exact_chunk" for s in ran)
    _check(results, y_ref.transpose(1, 2), S_ref)


def test_gated_deltanet_equals_fla():
    """Gated DeltaNet takes the gradient at the decayed memory (zoo:decay_first): equal to fla's
    loop, and a different rule from core:decay (gradient at M_{t-1}) with the same gates."""
    ref = fla_reference("ops/gated_delta_rule/naive.py")
    q, k, v, alpha, beta = _inputs(5)
    y_ref, S_ref = ref.naive_recurrent_gated_delta_rule(q, k, v, beta, alpha.log(), scale=1.0,
                                                        output_final_state=True)
    gates = {"alpha": alpha, "theta": beta}
    results, ran = _ours("zoo:gated_deltanet", gates, q, k, v)
    assert any(isinstance(s, dict) and s["use"] == "core:exact_chunk" for s in ran)
    _check(results, y_ref, S_ref)
    other = ac.build_rule({"use": "zoo:deltanet", "retention": "core:decay"}, heads=H, d_key=D, d_value=D)
    with torch.no_grad():
        y_other, _ = other(q, k, v, gates=gates, strategy="core:sequential")
    assert (y_other - y_ref).abs().max() > 1e-3


def test_a_retained_gradient_point_refuses_an_anchor_and_chunkwise():
    from atlas_core.errors import SpecError

    with pytest.raises(SpecError, match="anchor"):
        ac.build_rule({"use": "zoo:gated_deltanet", "anchor": 16})
    rule = ac.build_rule("zoo:gated_deltanet")
    with pytest.raises(StrategyError, match="decayed memory"):
        rule.runner({"use": "core:chunkwise", "chunk_size": 1})


def test_zoo_presets_are_per_token_rules_in_the_conventions():
    for name in ("zoo:linear_attention", "zoo:retnet", "zoo:simple_gla", "zoo:deltanet", "zoo:gated_deltanet"):
        rule = ac.build_rule(name)
        assert rule.anchor == 1 and rule.spec["structure"] == "core:linear"
    assert ac.build_rule("zoo:retnet").gate_names == ("theta",)  # fixed decay: no alpha gate
