"""The memory layer (atlas_core/layer.py) against its documented pipeline, written out by hand:
projections, short causal depthwise conv, SiLU, q/k l2 norm, gates with their parametrisation and
bias init, the rule, per-head output norm, sigmoid output gate, output projection; the conv and rule
state carry across calls; bad input."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from einops import rearrange

import atlas_core as ac
from atlas_core.layer import LayerParams, MemoryLayer

DT = torch.float64


def make_layer(memory=None, d_model=12, heads=3, **layer):
    torch.manual_seed(0)
    rule = ac.build_rule(memory or {"use": "titans:titans", "parallel": "core:sequential"})
    return MemoryLayer(d_model, heads, rule, LayerParams(**layer), strategy="core:sequential").to(DT)


def hand_conv(z: torch.Tensor, mod) -> torch.Tensor:
    """``mod``'s causal depthwise convolution of ``z: [B, T, C]`` from zeros, by hand:
    ``out_t = sum_j w[j] z_{t - (K-1) + j}``."""
    B, T, C = z.shape
    K = mod.kernel
    pad = torch.cat([z.new_zeros(B, K - 1, C), z], 1)
    return sum(mod.weight[:, 0, j] * pad[:, j : j + T] for j in range(K))


def hand_layer(layer: MemoryLayer, x: torch.Tensor):
    """The module docstring's steps 1-6, one by one, with the layer's weights."""
    p, H = layer.params, layer.heads
    B, T, _ = x.shape
    q, k, v = x @ layer.q_proj.weight.T, x @ layer.k_proj.weight.T, x @ layer.v_proj.weight.T
    if p.conv_size > 1:
        q, k, v = hand_conv(q, layer.q_conv), hand_conv(k, layer.k_conv), hand_conv(v, layer.v_conv)
    if p.qkv_activation == "silu":
        q, k, v = q * torch.sigmoid(q), k * torch.sigmoid(k), v * torch.sigmoid(v)
    q, k, v = (z.reshape(B, T, H, -1) for z in (q, k, v))
    if p.qk_norm:
        q, k = q / q.norm(dim=-1, keepdim=True), k / k.norm(dim=-1, keepdim=True)
    raw = (x @ layer.gate_proj.weight.T + layer.gate_proj.bias).reshape(B, T, -1, H)
    gates = {}
    for i, name in enumerate(layer.gate_names):
        g = torch.sigmoid(raw[:, :, i])
        gates[name] = p.theta_scale * g if name == "theta" else g
    y, _ = layer.rule(q, k, v, gates=gates, strategy="core:sequential")
    if p.output_norm:
        y = y / torch.sqrt(y.pow(2).mean(-1, keepdim=True) + 1e-6) * layer.out_norm.weight
    y = y.reshape(B, T, -1)
    if p.output_gate is not False:  # None: the core's sigmoid gate
        y = y * torch.sigmoid(x @ layer.out_gate.weight.T + layer.out_gate.bias)
    return y @ layer.o_proj.weight.T


@pytest.mark.parametrize("options", [
    {},
    {"conv_size": 0, "qk_norm": False, "qkv_activation": "none"},
    {"output_norm": False, "output_gate": False, "theta_scale": 0.5, "conv_size": 2},
], ids=["defaults", "no-conv-no-norm", "no-out-norm-gate"])
def test_forward_is_the_documented_pipeline(options):
    layer = make_layer(**options)
    x = torch.randn(2, 7, 12, dtype=DT)
    with torch.no_grad():
        y, _ = layer(x)
        torch.testing.assert_close(y, hand_layer(layer, x), rtol=0, atol=1e-12)
    assert hasattr(layer, "q_conv") == (options.get("conv_size", 4) > 1)


def test_gate_bias_init_and_only_the_rule_gates():
    layer = make_layer(gate_bias={"alpha": 1.0, "theta": -2.0})
    assert layer.gate_names == ("alpha", "eta", "theta")  # titans: no gamma
    H = layer.heads
    want = torch.tensor([1.0] * H + [2.0] * H + [-2.0] * H, dtype=DT)  # eta keeps its default 2.0
    assert torch.equal(layer.gate_proj.bias.detach(), want)
    assert layer.gate_proj.weight.abs().max() < 0.2  # small weights: gates start near sigmoid(bias)
    gates = layer.gates(torch.zeros(1, 2, 12, dtype=DT))
    torch.testing.assert_close(gates["alpha"], torch.full((1, 2, H), torch.sigmoid(torch.tensor(1.0)).item(), dtype=DT))
    torch.testing.assert_close(gates["theta"], torch.full((1, 2, H), torch.sigmoid(torch.tensor(-2.0)).item(), dtype=DT))
    defaults = make_layer()
    g = defaults.gates(torch.zeros(1, 1, 12, dtype=DT))
    assert abs(g["alpha"].mean().item() - 0.9526) < 1e-3 and abs(g["theta"].mean().item() - 0.0099) < 1e-3
    gamma = make_layer({"use": "omega:omega_titans",
                        "bias": {"use": "omega:window", "window": 2, "gamma": "gate"}})
    assert gamma.gate_names == ("alpha", "eta", "theta", "gamma")
    none = make_layer({"bias": "core:dot", "algorithm": "core:gd"})
    assert none.gate_names == ("theta",) and none.gate_proj.out_features == 3


def test_state_carries_conv_and_rule_across_calls():
    layer = make_layer(conv_size=3)
    x = torch.randn(2, 9, 12, dtype=DT)
    with torch.no_grad():
        y, s = layer(x)
        y1, s1 = layer(x[:, :4])
        y2, s2 = layer(x[:, 4:], s1)
    assert set(s) == {"conv.q", "conv.k", "conv.v", "rule.M", "rule.Z.M"}
    assert s["conv.q"].shape == (2, 2, 12)  # the last conv_size - 1 inputs
    torch.testing.assert_close(torch.cat([y1, y2], 1), y, rtol=0, atol=1e-12)
    for key in s:
        torch.testing.assert_close(s2[key], s[key], rtol=0, atol=1e-12)


@pytest.mark.parametrize("memory,strategy", [
    ({"use": "titans:titans", "anchor": 4}, {"use": "core:chunkwise", "chunk_size": 4}),
    ({"use": "titans:titans", "anchor": 4}, {"use": "core:chunkwise", "chunk_size": 2}),
    ({"use": "titans:titans", "anchor": 4}, "core:sequential"),
], ids=["anchor4-chunk4", "anchor4-chunk2", "anchor4-sequential"])
def test_any_split_of_calls_equals_one_call_with_an_anchored_rule(memory, strategy):
    """The layer's state carries the rule's anchor entries: splits off the chunk grid and
    token-by-token decoding equal one call, and all equal the sequential strategy."""
    torch.manual_seed(0)
    rule = ac.build_rule(memory)
    layer = MemoryLayer(12, 3, rule, LayerParams(conv_size=3), strategy=strategy).to(DT)
    assert layer.runner is rule.runner(strategy)  # resolved once, when the layer was built
    x = torch.randn(2, 11, 12, dtype=DT)
    with torch.no_grad():
        y, s = layer(x)
        assert set(s) == {"conv.q", "conv.k", "conv.v", "rule.M", "rule.Z.M", "rule.anchor.pos",
                          "rule.anchor.M"}
        for cuts in [(3,), (5, 6), tuple(range(1, 11))]:
            bounds, ys, st = [0, *cuts, 11], [], None
            for lo, hi in zip(bounds, bounds[1:]):
                yi, st = layer(x[:, lo:hi], st)
                ys.append(yi)
            torch.testing.assert_close(torch.cat(ys, 1), y, rtol=0, atol=1e-12)
            for key in s:
                torch.testing.assert_close(st[key], s[key], rtol=0, atol=1e-12)
        seq = MemoryLayer(12, 3, rule, LayerParams(conv_size=3), strategy="core:sequential").to(DT)
        seq.load_state_dict(layer.state_dict())
        torch.testing.assert_close(seq(x)[0], y, rtol=0, atol=1e-12)


def test_causal():
    layer = make_layer(conv_size=4)
    x = torch.randn(1, 8, 12, dtype=DT)
    x2 = x.clone()
    x2[:, 5:] += 1.0
    with torch.no_grad():
        a, b = layer(x)[0], layer(x2)[0]
    assert torch.equal(a[:, :5], b[:, :5]) and (a[:, 5:] - b[:, 5:]).abs().max() > 1e-6


def test_feature_map_parameters_belong_to_the_layer():
    layer = make_layer({"use": "omega:omeganet"}, d_model=8, heads=2)
    names = dict(layer.named_parameters())
    assert "rule.feature_map.coef" in names
    y, _ = layer(torch.randn(1, 5, 8, dtype=DT))
    y.sum().backward()
    assert names["rule.feature_map.coef"].grad.abs().max() > 0


def test_bad_input():
    layer = make_layer()
    with pytest.raises(ValueError, match=r"x must be \[B, T, d_model=12\], got \(2, 5, 10\)"):
        layer(torch.randn(2, 5, 10, dtype=DT))
    with pytest.raises(ValueError, match=r"d_model=10 is not divisible by heads=3; set layer.d_key"):
        MemoryLayer(10, 3, ac.build_rule("titans:titans"))
    sized = MemoryLayer(10, 3, ac.build_rule("titans:titans"), LayerParams(d_key=4))
    assert sized.q_proj.out_features == 12 and sized.v_proj.out_features == 12


@pytest.mark.parametrize("kernel", [2, 4])
def test_short_conv_equals_depthwise_conv1d(kernel):
    """ShortConv's shifted multiply-adds against F.conv1d (groups = channels) on the cache-extended
    input: outputs, carried cache and gradients, float64."""
    import torch.nn.functional as F

    from atlas_core.layer import ShortConv

    torch.manual_seed(0)
    conv = ShortConv(6, kernel).double()
    x = torch.randn(2, 9, 6, dtype=torch.float64, requires_grad=True)
    cache = torch.randn(2, kernel - 1, 6, dtype=torch.float64)
    y, new_cache = conv(x, cache)
    ext = torch.cat([cache, x], dim=1)
    ref = F.conv1d(ext.transpose(1, 2), conv.weight, groups=6).transpose(1, 2)
    torch.testing.assert_close(y, ref, rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(new_cache, ext[:, -(kernel - 1):])
    dy = torch.randn_like(y)
    g = torch.autograd.grad(y, (x, conv.weight), dy)
    g_ref = torch.autograd.grad(ref, (x, conv.weight), dy)
    for a, b in zip(g, g_ref):
        torch.testing.assert_close(a, b, rtol=1e-12, atol=1e-12)
