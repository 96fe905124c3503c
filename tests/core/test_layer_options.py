"""The layer options published layers differ in (docs/zoo.md, "Layer options"): gate forms, output
gate kinds, q scale, l2-norm eps, short-conv init, presets' declared defaults, SwiGLU and normal init."""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F

import atlas_core as ac
from atlas_core.errors import SpecError
from atlas_core.layer import LayerParams, MemoryLayer
from atlas_core.lm import SwiGLU, swiglu_hidden

DT = torch.float64


def _layer(rule: str, **layer) -> MemoryLayer:
    torch.manual_seed(0)
    return MemoryLayer(12, 3, ac.build_rule(rule), LayerParams(**layer), strategy="core:sequential").to(DT)


def test_gate_forms_compute_their_equations():
    layer = _layer("zoo:gated_deltanet", gate_form={"alpha": "mamba2", "theta": "no_bias"})
    with torch.no_grad():
        layer.gate_proj.bias.normal_()  # the no_bias rows must still be ignored
    x = torch.randn(2, 5, 12, dtype=DT)
    raw = (x @ layer.gate_proj.weight.T).reshape(2, 5, 2, 3)  # rows: alpha (3 heads), theta (3)
    dt_bias = layer.gate_proj.bias[:3]
    A = layer.gate_A_log["alpha"].exp()
    g = layer.gates(x)
    torch.testing.assert_close(g["alpha"], torch.exp(-A * F.softplus(raw[:, :, 0] + dt_bias)))
    torch.testing.assert_close(g["theta"], torch.sigmoid(raw[:, :, 1]))

    gla = _layer("zoo:gla", gate_form={"alpha": "gla"})
    z = F.linear(x, gla.gate_proj.weight, gla.gate_proj.bias)[..., :12].reshape(2, 5, 3, 4)
    torch.testing.assert_close(gla.gates(x)["alpha"], torch.sigmoid(z) ** (1 / 16))


def test_mamba2_init_is_in_its_ranges():
    torch.manual_seed(1)
    layer = MemoryLayer(64, 64, ac.build_rule("zoo:gated_deltanet"), LayerParams(d_key=2, gate_form={"alpha": "mamba2"}))
    A = layer.gate_A_log["alpha"].exp()
    assert A.shape == (64,) and 0 < A.min() and A.max() <= 16
    dt = F.softplus(layer.gate_proj.bias[:64])
    assert dt.min() >= 1e-4 - 1e-9 and dt.max() <= 0.1 + 1e-6
    assert dt.log().std() > 0.5  # spread over decades, log-uniform


def test_output_gate_kinds_and_q_scale():
    x = torch.randn(2, 6, 12, dtype=DT)
    base = _layer("zoo:deltanet", output_gate="none", q_scale=1.0, output_norm=False, conv_size=0)
    for kind, act in (("silu", F.silu), ("sigmoid", torch.sigmoid)):
        layer = _layer("zoo:deltanet", output_gate=kind, output_gate_bias=False, q_scale=1.0,
                       output_norm=False, conv_size=0)
        assert layer.out_gate.bias is None
        base.load_state_dict({k: v for k, v in layer.state_dict().items() if not k.startswith("out_gate")})
        y_plain = base(x)[0] @ torch.linalg.pinv(base.o_proj.weight.T)
        y_gated = layer(x)[0] @ torch.linalg.pinv(layer.o_proj.weight.T)
        torch.testing.assert_close(y_gated, y_plain * act(x @ layer.out_gate.weight.T))
    # q scale: the read is linear in q, so without the norm the output scales with it
    half = _layer("zoo:deltanet", output_gate="none", q_scale=0.5, output_norm=False)
    one = _layer("zoo:deltanet", output_gate="none", q_scale=1.0, output_norm=False)
    one.load_state_dict(half.state_dict())
    torch.testing.assert_close(half(x)[0], 0.5 * one(x)[0])
    assert _layer("zoo:deltanet", q_scale="rsqrt_d_key").q_scale == pytest.approx(1 / 2)  # d_key 4


def test_qk_norm_eps_is_fla_l2norm():
    x = torch.randn(2, 6, 12, dtype=DT)
    from atlas_core.layer import l2_normalize

    z = torch.randn(4, 7, dtype=DT)
    torch.testing.assert_close(l2_normalize(z, 1e-6), z / torch.sqrt(z.pow(2).sum(-1, keepdim=True) + 1e-6))
    torch.testing.assert_close(l2_normalize(z, 0.0), z / z.norm(dim=-1, keepdim=True))
    a = _layer("zoo:deltanet", qk_norm_eps=1e-6, conv_init="identity")
    b = _layer("zoo:deltanet", qk_norm_eps=0.0, conv_init="identity")
    b.load_state_dict(a.state_dict())
    ya, yb = a(x)[0], b(x)[0]
    assert not torch.equal(ya, yb)  # the eps is used, and is small next to |q|^2 here
    torch.testing.assert_close(ya, yb, rtol=1e-3, atol=1e-4)


def test_conv_init_kinds():
    ident = _layer("zoo:gated_deltanet", conv_init="identity").q_conv.weight[:, 0].detach()
    normal = _layer("zoo:gated_deltanet", conv_init="normal").q_conv.weight[:, 0].detach()
    assert ident[:, -1].mean() > 0.9 and normal[:, -1].abs().mean() < 0.1
    assert normal.std().item() == pytest.approx(0.02, rel=0.5)


def _from_spec(rule: str, **layer) -> tuple[MemoryLayer, dict]:
    """A layer built from a resolved spec (the preset's layer defaults are resolved into it)."""
    from atlas_core.spec import load_spec

    spec = load_spec({"model": {"arch": "core:lm", "vocab_size": 16, "d_model": 12, "heads": 3},
                      "memory": {"use": rule, "parallel": "core:sequential"}, "layer": layer})
    torch.manual_seed(0)
    return MemoryLayer.from_spec(spec, d_model=12, heads=3).to(DT), spec.layer


def test_preset_declares_layer_defaults_and_the_spec_overrides_them():
    dn, table = _from_spec("zoo:deltanet")
    assert (table["output_gate"], table["q_scale"], table["conv_init"], table["gate_form"]) == (
        "none", "rsqrt_d_key", "normal", {"theta": "no_bias"})  # what the resolved spec shows
    assert dn.output_gate == "none" and not hasattr(dn, "out_gate")
    assert dn.gate_forms == ("no_bias",) and dn.q_scale == pytest.approx(0.5)
    assert dn.q_conv.weight[:, 0, -1].abs().mean().item() < 0.1  # fla's normal init
    over, table = _from_spec("zoo:deltanet", output_gate=True, gate_form={"theta": "declared"}, q_scale=1.0,
                             conv_init="identity")
    assert table["output_gate"] is True and table["gate_form"] == {"theta": "declared"}  # kept as written
    assert over.output_gate == "sigmoid" and over.gate_forms == ("declared",) and over.q_scale == 1.0
    # other presets and knob-composed rules keep the core's layer
    for rule in ("zoo:gated_deltanet", {"bias": "core:l2"}):
        other = MemoryLayer(12, 3, ac.build_rule(rule), LayerParams(), strategy="core:sequential")
        assert other.output_gate == "sigmoid" and set(other.gate_forms) == {"declared"} and other.q_scale == 1.0
    # the layer reads its params only: built by hand, a preset's rule gets the core's options
    plain = MemoryLayer(12, 3, ac.build_rule("zoo:deltanet"), LayerParams(), strategy="core:sequential")
    assert plain.output_gate == "sigmoid" and plain.gate_forms == ("declared",) and plain.q_scale == 1.0


@pytest.mark.parametrize("forms, path", [({"alfa": "mamba2"}, "layer.gate_form.alfa"),
                                         ({"theta": "mamba2"}, "layer.gate_form.theta")])
def test_gate_form_refuses_a_bad_entry(forms, path):
    with pytest.raises(SpecError) as err:
        _layer("zoo:gated_deltanet", gate_form=forms)
    assert path in str(err.value)


def test_swiglu_and_normal_init():
    assert swiglu_hidden(64, 4) == 256 and swiglu_hidden(512, 4) == 1536 and swiglu_hidden(1024, 4) == 2816
    mlp = SwiGLU(8, 16).to(DT)
    x = torch.randn(3, 8, dtype=DT)
    torch.testing.assert_close(mlp(x), (F.silu(x @ mlp.gate.weight.T) * (x @ mlp.up.weight.T)) @ mlp.down.weight.T)
    spec = {"model": {"arch": "core:lm", "vocab_size": 50, "d_model": 48, "depth": 1, "mlp": "swiglu",
                      "init_std": 0.05, "tie_embeddings": False},
            "memory": {"use": "zoo:gated_deltanet"}}
    torch.manual_seed(0)
    model = ac.build_model(spec)
    block = model.blocks[0]
    assert isinstance(block.mlp, SwiGLU) and block.mlp.up.out_features == 256
    for w in (model.embed.weight, model.head.weight, block.mlp.down.weight, block.memory.q_proj.weight):
        assert w.std().item() == pytest.approx(0.05, rel=0.2)
    assert block.memory.out_gate.bias.abs().max() == 0
    assert block.memory.gate_proj.bias[0].item() == pytest.approx(3.0)  # alpha's declared bias kept
    assert not math.isclose(model.head.weight.std().item(), model.embed.weight.std().item(), rel_tol=1e-9)
