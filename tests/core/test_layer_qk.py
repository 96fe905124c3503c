"""The layer's feature map on q and k and its rotary embeddings (``[layer] qk_feature_map``,
``rotary``; atlas_core/layer_qk.py): their equations, the key size the rule sees, the position
carried across calls and per packed document, what is refused, and that both are off by default."""

from __future__ import annotations

import pytest
import torch

import atlas_core as ac
from atlas_core.errors import SpecError
from atlas_core.layer import LayerParams, MemoryLayer
from atlas_core.layer_qk import QKFeatureMap, positions, rotary

DT = torch.float64
TOL = 1e-10


def _layer(rule: str = "zoo:retnet", **layer) -> MemoryLayer:
    torch.manual_seed(0)
    return MemoryLayer(12, 3, ac.build_rule(rule), LayerParams(**layer), strategy="core:sequential").to(DT)


def test_rotary_rotates_each_pair_by_its_position_angle():
    x = torch.randn(2, 5, 3, 8, dtype=DT)
    pos = torch.tensor([[0, 1, 2, 3, 4], [7, 8, 9, 10, 11]])
    got = rotary(x, pos, 10000.0)
    f = 10000.0 ** (-torch.arange(0, 8, 2, dtype=torch.float32) / 8)
    z = torch.polar(torch.ones(2, 5, 4), pos[..., None].float() * f)[:, :, None].to(torch.complex128)
    want = torch.complex(x[..., :4], x[..., 4:]) * z
    # the angles are float32 (as fla computes them), so sin and cos agree to float32 rounding only
    torch.testing.assert_close(got, torch.cat([want.real, want.imag], -1), rtol=1e-6, atol=1e-6)
    torch.testing.assert_close(rotary(x, torch.zeros(2, 5, dtype=torch.long), 10.0), x)  # position 0
    # the inner product of a rotated pair depends on the positions' difference only
    q, k = torch.randn(1, 1, 1, 8, dtype=DT), torch.randn(1, 1, 1, 8, dtype=DT)
    at = lambda a, b: (rotary(q, torch.tensor([[a]]), 100.0) * rotary(k, torch.tensor([[b]]), 100.0)).sum()  # noqa: E731
    torch.testing.assert_close(at(3, 1), at(12, 10), rtol=1e-5, atol=1e-6)  # float32 angles


def test_positions_count_per_row_and_per_packed_document():
    assert positions(torch.tensor([0, 4]), 3).tolist() == [[0, 1, 2], [4, 5, 6]]
    assert positions(torch.tensor([2, 0, 5]), 6, [0, 2, 5, 6]).tolist() == [[2, 3, 0, 1, 2, 5]]


@pytest.mark.parametrize("kind", ["hadamard", "hedgehog", "t2r", "relu", "elu_p1"])
def test_feature_maps_compute_their_equations(kind):
    torch.manual_seed(1)
    phi = QKFeatureMap(kind, 4).to(DT)
    for p in phi.parameters():
        p.data.normal_()
    x = torch.randn(3, 4, dtype=DT)
    a = (lambda z: z @ phi.a.weight.T + (phi.a.bias if phi.a.bias is not None else 0)) if hasattr(phi, "a") else None
    want = {"hadamard": lambda: a(x) * (x @ phi.b.weight.T + phi.b.bias),
            "hedgehog": lambda: torch.softmax(torch.cat([2 * a(x), -2 * a(x)], -1), -1),
            "t2r": lambda: torch.clamp(a(x), min=0),
            "relu": lambda: torch.clamp(x, min=0),
            "elu_p1": lambda: torch.where(x > 0, x + 1, torch.exp(x))}[kind]()
    torch.testing.assert_close(phi(x), want)
    assert QKFeatureMap("hedgehog", 4).a.weight.equal(torch.eye(4))  # hedgehog starts at the identity


def test_a_feature_map_sets_the_rule_key_size_and_the_q_scale():
    layer = _layer("zoo:linear_attention", qk_feature_map="hedgehog", q_scale="rsqrt_d_key", conv_size=0,
                   qkv_activation="none", qk_norm=False, output_gate="none")
    assert layer.d_key == 4 and layer.d_rule_key == 8 and layer.q_scale == 8 ** -0.5
    assert layer.q_proj.out_features == 12 and set(dict(layer.named_children())) >= {"q_map", "k_map"}
    x = torch.randn(2, 5, 12, dtype=DT)
    y, state = layer(x)
    assert state["rule.M"].shape[-1] == 8  # M: [Dv, Dphi]
    # the layer applies the maps, then the scale: y equals the rule on those inputs
    q = layer.q_map(layer.q_proj(x).view(2, 5, 3, 4)) * 8 ** -0.5
    k = layer.k_map(layer.k_proj(x).view(2, 5, 3, 4))
    v = layer.v_proj(x).view(2, 5, 3, 4)
    o = torch.stack([torch.einsum("bhk,bshk,bshv->bhv", q[:, t], k[:, :t + 1], v[:, :t + 1]
                                  * layer.gates(x)["theta"][:, :t + 1, :, None]) for t in range(5)], 1)
    want = layer.o_proj(layer.out_norm(o).reshape(2, 5, 12))
    torch.testing.assert_close(y, want)
    tied = _layer("zoo:linear_attention", qk_feature_map="t2r", qk_feature_map_tied=True)
    assert hasattr(tied, "q_map") and not hasattr(tied, "k_map")


@pytest.mark.parametrize("strategy", ["core:sequential", {"use": "core:chunkwise", "chunk_size": 2}])
def test_rotary_position_continues_across_calls(strategy):
    torch.manual_seed(0)
    layer = MemoryLayer(12, 3, ac.build_rule("zoo:retnet"), LayerParams(rotary=True, conv_size=3),
                        strategy=strategy).to(DT)
    x = torch.randn(2, 9, 12, dtype=DT)
    y, state = layer(x)
    assert state["pos"].tolist() == [9, 9]
    a, s = layer(x[:, :4])
    b, s = layer(x[:, 4:5], s)
    c, s = layer(x[:, 5:], s)
    torch.testing.assert_close(torch.cat([a, b, c], 1), y, rtol=TOL, atol=TOL)
    assert s["pos"].tolist() == [9, 9]
    # rotary changes the function (positions matter)
    plain = MemoryLayer(12, 3, ac.build_rule("zoo:retnet"), LayerParams(conv_size=3), strategy=strategy).to(DT)
    plain.load_state_dict(layer.state_dict())
    assert (plain(x)[0] - y).abs().max() > 1e-3


def test_rotary_packed_documents_equal_one_call_each():
    layer = _layer(rotary=True, conv_size=3)
    lengths = (2, 5, 1)
    b = [0, 2, 7, 8]
    x = torch.randn(1, 8, 12, dtype=DT)
    _, warm = layer(torch.randn(3, 4, 12, dtype=DT))
    warm["pos"] = torch.tensor([4, 0, 11])  # documents at different positions
    y, state = layer(x, warm, cu_seqlens=torch.tensor(b))
    parts = [layer(x[:, b[i]:b[i + 1]], {k: t[i:i + 1] for k, t in warm.items()}) for i in range(len(lengths))]
    torch.testing.assert_close(y, torch.cat([p[0] for p in parts], 1), rtol=TOL, atol=TOL)
    assert state["pos"].tolist() == [6, 5, 12]


def test_rotary_refuses_an_odd_key_and_several_steps_per_token():
    with pytest.raises(SpecError, match="layer.rotary"):
        _layer(rotary=True, d_key=3)
    with pytest.raises(SpecError, match="steps_per_token"):
        _layer("zoo:gated_delta_product", rotary=True)


def test_both_are_off_by_default():
    layer = _layer()
    assert not any(n.startswith(("q_map", "k_map")) for n, _ in layer.named_parameters())
    assert "pos" not in layer(torch.randn(1, 3, 12, dtype=DT))[1]
    assert LayerParams().qk_feature_map == "none" and LayerParams().rotary is False
    with pytest.raises(Exception, match="qk_feature_map"):
        LayerParams(qk_feature_map="dpfp")
