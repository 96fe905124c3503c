"""Gate ends are always tried: a gate declared without ``range`` gets the ends its activation
implies (sigmoid [0, 1], tanh [-1, 1], softplus and exp >= 0, times its scale), a failure names
the gate and the end, and a bounded activation without a declared range is a warning."""

from __future__ import annotations

import types

import pytest
import torch

from atlas_core.host import hookimpl
from atlas_core.knobs import Bias, Gate
from atlas_core.testing import Case, check_component


def _bias(gate: Gate, weight):
    class GateWeighted(Bias):
        gates = (gate,)
        error_kind = "l2"

        def weight(self, gates, like):  # gates[name]: [B, T, H]
            return weight(gates[gate.name])

        def error(self, pred, v):
            return pred - v

        def loss(self, pred, v):
            return 0.5 * (pred - v).pow(2).sum(-1)

    return GateWeighted()


def _module(name, gate, weight):
    mod = types.ModuleType(f"{name}_mod")

    @hookimpl
    def atlas_register(registry):
        registry.add("bias", "weighted", lambda params, ctx: _bias(gate, weight))

    mod.atlas_register = atlas_register
    return mod


def _boundary(host_with, ns, gate, weight):
    host_with({ns: _module(ns, gate, weight)})
    return check_component(Case(f"{ns}:weighted"), on_fail="collect", checks=["check_boundary_inputs"])[0]


def nan_at_one(beta):  # -log(1 - beta): infinite at beta = 1, which sigmoid reaches in float32
    return -torch.log1p(-beta)


def test_a_gate_without_range_that_is_nan_at_its_sigmoid_end_fails_naming_gate_and_end(host_with):
    assert float(torch.sigmoid(torch.tensor(20.0))) == 1.0  # the end is reached in practice
    with pytest.warns(UserWarning, match="gate 'beta' has a sigmoid activation but no declared range"):
        res = _boundary(host_with, "edgy", Gate("beta", bias=0.0), nan_at_one)
    assert res.status == "failed", res.message
    assert "non-finite entries in the boundary case 'beta = 1 (an end of its sigmoid activation; no range " \
           "declared)'" in res.message
    assert any("declare range=(0, 1)" in n for n in res.notes)


def test_the_same_gate_with_its_range_declared_fails_without_a_warning(host_with, recwarn):
    res = _boundary(host_with, "edgy2", Gate("beta", bias=0.0, range=(0.0, 1.0)), nan_at_one)
    assert res.status == "failed" and "the boundary case 'beta = 1'" in res.message
    assert not [w for w in recwarn if "no declared range" in str(w.message)]


def test_a_sound_gate_without_range_passes_with_a_warning(host_with):
    with pytest.warns(UserWarning, match="no declared range"):
        res = _boundary(host_with, "edgy3", Gate("beta", bias=0.0), lambda beta: beta)
    assert res.status == "passed", res.message
    assert any(n.startswith("warning: gate 'beta' has a sigmoid activation") for n in res.notes)


@pytest.mark.parametrize("gate, want", [
    (Gate("g"), (0.0, 1.0)),
    (Gate("g", activation="tanh", scale=2.0), (-2.0, 2.0)),
    (Gate("g", activation="softplus"), (0.0, None)),
    (Gate("g", activation="exp", scale=-1.0), (None, -0.0)),
    (Gate("g", activation="identity"), None),
    (Gate("g", range=(0.0, 0.5)), (0.0, 0.5)),
])
def test_tested_range(gate, want):
    assert gate.tested_range() == want


def test_atlas_check_fails_on_it_naming_gate_and_end(host_with):
    import json

    from typer.testing import CliRunner

    from atlas_cli.main import make_app

    host_with({"edgy4": _module("edgy4", Gate("beta", bias=0.0), nan_at_one)})
    with pytest.warns(UserWarning, match="no declared range"):
        res = CliRunner().invoke(make_app(), ["--format", "json", "check", "edgy4:weighted",
                                              "--check", "check_boundary_inputs"])
    assert res.exit_code == 1, res.output[-2000:]
    row, = json.loads(res.stdout)["results"]
    assert row["status"] == "failed"
    assert "'beta = 1 (an end of its sigmoid activation; no range declared)'" in row["message"]
