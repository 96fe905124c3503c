"""Gates declared by the knobs (atlas_core.knobs.Gate): the core's declarations, the rule's merged
gates, the memory layer's projections built from them (any declared name, per-head or per-key),
``[layer] gate_bias`` keyed by gate name, conflicting declarations, and knobs written before
declarations (``gate_names`` only)."""

from __future__ import annotations

import pytest
import torch

import atlas_core as ac
from atlas_core.components.gd import GD
from atlas_core.errors import SpecError
from atlas_core.knobs import Algorithm, Bias, Gate, Retention
from atlas_core.knobs.algorithm import broadcast_gate
from atlas_core.knobs.gates import ALPHA, ETA, GAMMA, THETA
from atlas_core.layer import LayerParams, MemoryLayer

DT = torch.float64


def test_core_declarations_keep_the_historical_gates():
    assert (ALPHA.activation, ALPHA.bias, ALPHA.shape) == ("sigmoid", 3.0, "head")
    assert (ETA.activation, ETA.bias) == ("sigmoid", 2.0)
    assert (THETA.activation, THETA.bias, THETA.scale) == ("sigmoid", -4.6, 1.0)
    assert (GAMMA.activation, GAMMA.bias) == ("sigmoid", 3.0)
    rule = ac.build_rule({"use": "titans:titans"})
    assert rule.gates == (ALPHA, ETA, THETA) and rule.gate_names == ("alpha", "eta", "theta")
    gated = ac.build_rule({"retention": "core:decay", "algorithm": "core:gd",
                           "bias": {"use": "omega:window", "window": 2, "gamma": "gate"}})
    assert gated.gates == (ALPHA, THETA, GAMMA) and gated.gate_names == ("alpha", "gamma", "theta")


def test_traits_are_declared():
    rule = ac.build_rule({"use": "titans:titans"})
    assert rule.algorithm.linear_form == "momentum" and GD.linear_form == "gd"
    assert Algorithm.linear_form is None
    assert rule.bias.error_kind == "l2"
    assert ac.build_rule({"bias": "core:dot"}).bias.error_kind == "dot"
    window = ac.build_rule({"bias": {"use": "omega:window", "window": 3, "inner": "core:dot"}})
    assert window.bias.error_kind == "dot" and window.bias.prediction_free
    assert Bias.error_kind is None and not hasattr(Algorithm, "linear_in_grad")


def test_gate_validation():
    with pytest.raises(ValueError, match="identifier"):
        Gate("not a name")
    with pytest.raises(ValueError, match="shape"):
        Gate("b", shape="token")
    with pytest.raises(ValueError, match="activation"):
        Gate("b", activation="relu6")


class _PerKeyRate(Algorithm):
    """gd with a learning rate per key dimension: M_t = alpha M - theta * (rho * g), rho [B, H, Dk]
    broadcast over the rows of M (a test algorithm for a gate of shape "key")."""

    gates = (THETA, Gate("rho", shape="key", bias=2.0, summary="per-key rate"))

    def step(self, W, opt, g, *, alpha, gates, retention):
        theta, rho = gates["theta"], gates["rho"]  # [B, H], [B, H, Dk]
        return {k: broadcast_gate(alpha, W[k]) * W[k] - broadcast_gate(theta, g[k]) * g[k] * rho.unsqueeze(-2)
                for k in W}, opt


def _rule(algorithm=None, bias=None, retention=None):
    base = ac.build_rule({"retention": "core:decay", "algorithm": "core:gd"})
    return ac.ComposedRule(base.structure, bias or base.bias, retention or base.retention,
                           algorithm or base.algorithm, base.feature_map)


class _NamedRate(Algorithm):
    """gd whose step size is a gate named ``mu`` (role "step_size"): M_t = alpha M - mu g."""

    gates = (Gate("mu", bias=-2.0, range=(0.0, None), role="step_size", summary="step size"),)

    def step(self, W, opt, g, *, alpha, gates, retention):
        mu = gates["mu"]
        return {k: broadcast_gate(alpha, W[k]) * W[k] - broadcast_gate(mu, g[k]) * g[k] for k in W}, opt


def test_theta_scale_scales_the_step_size_gate_by_its_role():
    torch.manual_seed(0)
    layer = MemoryLayer(12, 2, _rule(_NamedRate()), LayerParams(theta_scale=0.5),
                        strategy="core:sequential").to(DT)
    assert layer.gate_names == ("alpha", "mu")
    x = torch.randn(2, 5, 12, dtype=DT)
    raw = x @ layer.gate_proj.weight.T + layer.gate_proj.bias
    g = layer.gates(x)
    torch.testing.assert_close(g["mu"], 0.5 * torch.sigmoid(raw[..., 2:4]))  # scaled: the step size
    torch.testing.assert_close(g["alpha"], torch.sigmoid(raw[..., :2]))  # not scaled


def test_a_key_gate_is_validated_and_passed_through():
    rule = _rule(_PerKeyRate()).bind(2, 3, 3)
    assert rule.gate_names == ("alpha", "rho", "theta")
    B, T, H, D = 1, 4, 2, 3
    q, k, v = (torch.randn(B, T, H, D, dtype=DT) for _ in range(3))
    gates = {"alpha": torch.full((B, T, H), 0.9, dtype=DT), "theta": torch.full((B, T, H), 0.5, dtype=DT),
             "rho": torch.rand(B, T, H, D, dtype=DT)}
    y, _ = rule(q, k, v, gates=gates)
    assert y.shape == (B, T, H, D)
    # rho = 1 everywhere is plain gd
    ones = dict(gates, rho=torch.ones(B, T, H, D, dtype=DT))
    plain = _rule().bind(2, 3, 3)
    y1, _ = rule(q, k, v, gates=ones)
    y2, _ = plain(q, k, v, gates={n: gates[n] for n in plain.gate_names})
    torch.testing.assert_close(y1, y2, rtol=0, atol=1e-12)
    with pytest.raises(ValueError, match=r"'rho' is declared per key: \[B, T, H, Dk\] = \[1, 4, 2, 3\]"):
        rule(q, k, v, gates={n: g for n, g in gates.items() if n != "rho"})
    with pytest.raises(ValueError, match=r"gates\['rho'\] .*\[B, T, H, Dk\]"):
        rule(q, k, v, gates=dict(gates, rho=torch.rand(B, T, H, dtype=DT)))


def test_the_layer_builds_every_declared_gate():
    torch.manual_seed(0)
    layer = MemoryLayer(12, 2, _rule(_PerKeyRate()), LayerParams(gate_bias={"rho": -1.0}, theta_scale=0.5),
                        strategy="core:sequential").to(DT)
    assert layer.gate_names == ("alpha", "theta", "rho")
    Dk = layer.d_key
    assert layer.gate_proj.out_features == 2 + 2 + 2 * Dk
    want = torch.tensor([3.0] * 2 + [-4.6] * 2 + [-1.0] * 2 * Dk).to(DT)  # set in float32
    assert torch.equal(layer.gate_proj.bias.detach(), want)
    x = torch.randn(2, 5, 12, dtype=DT)
    g = layer.gates(x)
    assert g["alpha"].shape == (2, 5, 2) and g["rho"].shape == (2, 5, 2, Dk)
    raw = x @ layer.gate_proj.weight.T + layer.gate_proj.bias
    torch.testing.assert_close(g["theta"], 0.5 * torch.sigmoid(raw[..., 2:4]))
    torch.testing.assert_close(g["rho"], torch.sigmoid(raw[..., 4:]).reshape(2, 5, 2, Dk))
    y, _ = layer(x)
    assert y.shape == x.shape and torch.isfinite(y).all()


def test_gate_bias_keys_must_name_a_declared_gate():
    rule = ac.build_rule({"use": "titans:titans"})
    with pytest.raises(SpecError) as info:
        MemoryLayer(12, 3, rule, LayerParams(gate_bias={"alfa": 1.0, "beta": 0.0}))
    paths = {i.path: i for i in info.value.issues}
    assert set(paths) == {"layer.gate_bias.alfa", "layer.gate_bias.beta"}
    assert "alpha, eta, theta" in paths["layer.gate_bias.alfa"].message
    assert paths["layer.gate_bias.alfa"].hint.startswith("did you mean 'alpha'")
    # the core's four names stay valid for any rule (old specs set them whatever the rule)
    layer = MemoryLayer(12, 3, ac.build_rule({"bias": "core:dot"}), LayerParams(gate_bias={"gamma": 1.0, "alpha": 0.0}))
    assert layer.gate_names == ("theta",)


def test_a_spec_with_an_undeclared_gate_bias_key_is_refused():
    spec = {"model": {"arch": "core:lm", "vocab_size": 8, "d_model": 8, "depth": 1, "heads": 2},
            "memory": {"use": "titans:titans"}, "layer": {"gate_bias": {"betta": 1.0}}}
    with pytest.raises(SpecError) as info:
        ac.load_spec(spec)
    (issue,) = [i for i in info.value.issues if i.path == "layer.gate_bias.betta"]
    assert "alpha, eta, theta" in issue.message
    spec["layer"]["gate_bias"] = {"alpha": 2.0, "gamma": 1.0}  # the core's names: valid as before
    assert ac.load_spec(spec).layer["gate_bias"] == {"alpha": 2.0, "gamma": 1.0}


def test_conflicting_declarations_are_a_build_error():
    class OtherTheta(Retention):
        gates = (Gate("theta", bias=0.0),)

    with pytest.raises(SpecError, match="gate 'theta' is declared differently by the retention"):
        _rule(retention=OtherTheta())


def test_knobs_written_before_declarations_still_work():
    class OldDecay(Retention):
        gate_names = ("alpha",)

        def alpha(self, gates, like):
            return gates["alpha"]

    rule = _rule(retention=OldDecay())
    assert rule.gates == (ALPHA, THETA)

    class OldCustom(Retention):
        gate_names = ("lam",)

    with pytest.raises(SpecError, match="declare every gate"):
        _rule(retention=OldCustom())
