"""The ``omega:omeganet`` and ``omega:omega_titans`` presets, with linear and deep (titans:mlp)
memory; ``omega_titans`` with c = 1 is ``titans:titans``."""

import pytest
import torch

import atlas_core as ac

from .conftest import assert_same, chunk, gates_for, make_inputs

STRUCTURES = ["core:linear", {"use": "titans:mlp", "depth": 2, "expansion": 2}]


def test_presets_resolve_to_their_knobs():
    net = ac.build_rule("omega:omeganet")
    assert net.spec["bias"]["use"] == "omega:window" and net.window == 8
    assert net.bias.mode == "uniform" and net.spec["algorithm"] == "core:gd"
    assert net.spec["retention"] == "core:decay" and net.spec["feature_map"]["use"] == "omega:poly"
    assert net.gate_names == ("alpha", "theta")
    tit = ac.build_rule("omega:omega_titans")
    assert tit.window == 8 and tit.spec["algorithm"] == "core:momentum"
    assert tit.spec["feature_map"] == "core:identity"
    assert tit.gate_names == ("alpha", "eta", "theta")
    gated = ac.build_rule({"use": "omega:omeganet",
                           "bias": {"use": "omega:window", "window": 8, "gamma": "gate"}})
    assert gated.gate_names == ("alpha", "gamma", "theta")


@pytest.mark.parametrize("preset", ["omega:omeganet", "omega:omega_titans"])
@pytest.mark.parametrize("structure", STRUCTURES, ids=["linear", "mlp"])
def test_preset_runs_and_strategies_agree(preset, structure):
    # Dk == Dv so the MLP's residual applies (the elementwise poly map keeps Dphi = Dk)
    q, k, v, gates = make_inputs(T=13, Dk=4, Dv=4, seed=1)
    rule = ac.build_rule({"use": preset, "structure": structure}, heads=2, d_key=4, d_value=4)
    assert rule.anchor == 1  # the presets are per-token rules
    g = gates_for(rule, gates)
    y, s = rule(q, k, v, gates=g, strategy="core:sequential")
    assert y.shape == v.shape and torch.isfinite(y).all()
    assert s["window.k"].shape == (2, 2, 7, 4)
    assert_same(rule(q, k, v, gates=g, strategy=chunk(1)), (y, s))
    # chunk 4 on the preset anchored at 4 (a key override like any knob) equals its sequential run
    rule4 = ac.build_rule({"use": preset, "structure": structure, "anchor": 4},
                          heads=2, d_key=4, d_value=4)
    rule4.load_state_dict(rule.state_dict())  # the same learned map and initial memory
    y4, s4 = rule4(q, k, v, gates=g, strategy=chunk(4))
    assert_same((y4, s4), rule4(q, k, v, gates=g, strategy="core:sequential"))
    assert (y4 - y).abs().max() > 1e-6  # anchoring at 4 is another function


@pytest.mark.parametrize("strategy,anchor", [("core:sequential", 1), ("core:sequential", 4), (chunk(4), 4)],
                         ids=["sequential", "sequential-anchor4", "chunkwise4-anchor4"])
@pytest.mark.parametrize("gamma", ["gate", "uniform"])
def test_omega_titans_with_window_one_is_titans(strategy, anchor, gamma):
    q, k, v, gates = make_inputs(T=10, seed=4)
    gates["gamma"] = torch.ones_like(gates["gamma"])
    omega = ac.build_rule({"use": "omega:omega_titans", "anchor": anchor,
                           "bias": {"use": "omega:window", "window": 1, "gamma": gamma}})
    titans = ac.build_rule({"use": "titans:titans", "anchor": anchor})
    y1, s1 = omega(q, k, v, gates=gates_for(omega, gates), strategy=strategy)
    y2, s2 = titans(q, k, v, gates=gates_for(titans, gates), strategy=strategy)
    assert torch.equal(y1, y2)
    assert set(s1) == set(s2) and all(torch.equal(s1[n], s2[n]) for n in s1)


def test_omega_titans_deep_with_window_one_is_titans_deep():
    """titans:titans_deep is anchored at 16 by default: omega_titans with a one-token window and
    the same anchor is the same rule, under every strategy that accepts it."""
    q, k, v, gates = make_inputs(T=20, Dk=4, Dv=4, seed=2)
    deep = ac.build_rule("titans:titans_deep", heads=2, d_key=4, d_value=4)
    assert deep.anchor == 16
    omega = ac.build_rule({"use": "omega:omega_titans", "structure": "titans:mlp", "anchor": 16,
                           "bias": {"use": "omega:window", "window": 1}},
                          heads=2, d_key=4, d_value=4)
    deep.load_state_dict(omega.state_dict())  # the same learned initial memory
    for strategy in ("core:sequential", chunk(4), "core:chunkwise"):
        y1, s1 = omega(q, k, v, gates=gates_for(omega, gates), strategy=strategy)
        y2, s2 = deep(q, k, v, gates=gates_for(deep, gates), strategy=strategy)
        torch.testing.assert_close(y1, y2, atol=1e-12, rtol=0)
        assert set(s1) == set(s2) and "anchor.pos" in s1
        for n in s1:
            torch.testing.assert_close(s1[n], s2[n], atol=1e-12, rtol=0)
    # at the per-token default omega_titans is another function than titans_deep
    per_token = ac.build_rule({"use": "omega:omega_titans", "structure": "titans:mlp",
                               "bias": {"use": "omega:window", "window": 1}},
                              heads=2, d_key=4, d_value=4)
    per_token.load_state_dict(omega.state_dict())
    y3, _ = per_token(q, k, v, gates=gates_for(per_token, gates))
    assert (y3 - y2).abs().max() > 1e-6


def test_preset_overrides_are_key_by_key():
    rule = ac.build_rule({"use": "omega:omeganet", "algorithm": "core:momentum",
                          "bias": {"use": "omega:window", "window": 3, "gamma": "decay",
                                   "decay": 0.5}})
    assert rule.spec["algorithm"] == "core:momentum" and rule.window == 3
    assert rule.spec["feature_map"]["use"] == "omega:poly"  # not overridden: from the preset
    torch.testing.assert_close(rule.bias.lag_weights(torch.float64, torch.device("cpu")),
                               torch.tensor([1.0, 0.5, 0.25], dtype=torch.float64))
