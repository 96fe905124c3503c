"""When the fla backends run: "auto" hands them calls only with a certificate for this device
(and the installed versions); forcing runs them without; `atlas env` (`explain`) says why one was
passed over; the switches work; a model under "auto" runs through them once certified."""

from __future__ import annotations

import json

import pytest
import torch

pytest.importorskip("fla.ops")

from atlas_core.backends import bind_backends, explain  # noqa: E402
from atlas_core.errors import StrategyError  # noqa: E402
from atlas_plugins.fla_backend import certificates  # noqa: E402
from atlas_plugins.fla_backend.availability import device_name  # noqa: E402
from tests.fla_backend.calls import assert_same, call, rule_of, through  # noqa: E402


def rows(strategy):
    return {r["backend"]: r for r in explain(strategy)}


def test_auto_passes_over_an_uncertified_backend(stand_in):
    row = rows("core:chunkwise")["fla:gla"]
    assert row["status"] == "uncertified"
    assert f"no certificate for fla:gla on {device_name()}" in row["reason"]
    assert "atlas fla certify fla:gla" in row["reason"] and "ATLAS_BACKEND=fla:gla" in row["reason"]
    rule = rule_of("zoo:gla")
    assert rule.runner("auto").name == "core:chunkwise"  # what "auto" runs GLA with
    args = call(rule, 11)
    through(rule, "auto", args)
    assert not stand_in  # the PyTorch code ran


def test_a_certificate_makes_it_eligible(stand_in):
    certificates.record("fla:gla", device_name())
    assert rows("core:chunkwise")["fla:gla"]["status"] == "available"
    rule = rule_of("zoo:gla")
    args = call(rule, 11)
    got = through(rule, "auto", args)
    assert [c["op"] for c in stand_in] == ["chunk_gla"]
    assert_same(got, through(rule, {"use": "core:chunkwise", "backend": "torch"}, args), args)
    # the other backends stay uncertified
    assert rows("core:chunkwise")["fla:simple_gla"]["status"] == "uncertified"
    stand_in.clear()
    through(rule_of("zoo:simple_gla"), "auto", call(rule_of("zoo:simple_gla"), 11))
    assert not stand_in


def test_a_certificate_for_other_versions_or_another_device_does_not_count(stand_in, certs):
    here = certificates.key("fla:gla", device_name())
    other_device = {**here, "device": "NVIDIA H100 80GB HBM3 (sm_90)"}
    older_fla = {**here, "fla": "0.5.0"}
    certs.write_text(json.dumps({"format": certificates.FORMAT, "records": [other_device, older_fla]}))
    row = rows("core:chunkwise")["fla:gla"]
    assert row["status"] == "uncertified"
    assert f"it was certified there with fla 0.5.0, atlas {here['atlas']}" in row["reason"]
    through(rule_of("zoo:gla"), "auto", call(rule_of("zoo:gla"), 5))
    assert not stand_in


def test_an_unreadable_certificate_file_certifies_nothing(stand_in, certs):
    certs.write_text("{not json")
    row = rows("core:chunkwise")["fla:gla"]
    assert row["status"] == "uncertified" and "is unreadable" in row["reason"]


def test_forcing_runs_an_uncertified_backend(stand_in, monkeypatch):
    rule = rule_of("zoo:simple_gla")
    args = call(rule, 9)
    through(rule, {"use": "core:chunkwise", "backend": "fla:simple_gla"}, args)
    assert [c["op"] for c in stand_in] == ["chunk_simple_gla"]
    monkeypatch.setenv("ATLAS_BACKEND", "fla:simple_gla")
    through(rule_of("zoo:simple_gla"), "auto", args)
    assert len(stand_in) == 2
    # a forced backend that cannot serve the call is an error naming it and why
    monkeypatch.setenv("ATLAS_BACKEND", "fla:gla")
    with pytest.raises(StrategyError, match="backend fla:gla was requested but refused this call: "
                                            "fla's chunk_simple_gla computes this rule"):
        through(rule_of("zoo:simple_gla"), "auto", args)


def test_disabling_wins_over_a_certificate(stand_in, monkeypatch):
    certificates.record("fla:gla", device_name())
    monkeypatch.setenv("ATLAS_DISABLE_BACKENDS", "fla:gla")
    assert rows("core:chunkwise")["fla:gla"]["status"] == "disabled"
    through(rule_of("zoo:gla"), "auto", call(rule_of("zoo:gla"), 5))
    assert not stand_in


def test_without_the_hook_the_cpu_runs_pytorch(certs, monkeypatch):
    row = rows("core:chunkwise")["fla:gla"]
    assert row["status"] == "unavailable" and row["reason"].startswith("no CUDA device")
    rule = rule_of("zoo:gla")
    through(rule, "auto", call(rule, 5))  # runs (PyTorch)
    with pytest.raises(StrategyError, match="backend fla:gla was requested but unavailable: no CUDA device"):
        through(rule_of("zoo:gla"), {"use": "core:chunkwise", "backend": "fla:gla"}, call(rule, 5))


def test_exact_chunk_binds_only_certified_backends(stand_in):
    """core:exact_chunk (what "auto" runs the delta rules with) lists the fla backends; binding
    keeps a backend only with a certificate, and then its verifier accepts the call."""
    from atlas_core.strategies.base import resolve_strategy

    def bound():
        return {name: (be, why) for name, be, why in bind_backends("core:exact_chunk").candidates}

    assert set(bound()) == {"fla:delta_rule", "fla:gated_delta_rule", "fla:kda", "fla:gla", "fla:simple_gla"}
    be, why = bound()["fla:kda"]
    assert be is None and why.startswith("not certified: no certificate for fla:kda")
    certificates.record("fla:kda", device_name())
    be, why = bound()["fla:kda"]
    assert be is not None and why == ""
    rule = rule_of("zoo:kda")
    q, k, v, gates, state = call(rule, 7)
    p = rule.prepare(q, k, v, gates=gates, state=state)
    strat = resolve_strategy(rule, "auto")
    assert strat.name == "core:exact_chunk"
    assert bind_backends("core:exact_chunk").select(strat, rule, p) is be
    row = rows("core:exact_chunk")["fla:kda"]
    assert row["status"] == "available"


def test_a_model_under_auto_runs_through_the_certified_backend(stand_in):
    """core:lm with GLA memory layers under "auto": the layers' calls reach fla's op once
    certified, with the logits and every parameter gradient of the PyTorch run."""
    import atlas_core as ac

    spec = {"schema": "atlas/1", "name": "fla-gla",
            "model": {"arch": "core:lm", "vocab_size": 32, "d_model": 32, "depth": 2, "heads": 2},
            "memory": {"use": "zoo:gla"}}
    ids = torch.randint(0, 32, (2, 13), generator=torch.Generator().manual_seed(0))

    def run():
        torch.manual_seed(0)
        model = ac.build_model(spec)
        logits = model(ids)
        logits.square().mean().backward()
        return logits, {n: p.grad for n, p in model.named_parameters()}

    want = run()
    assert not stand_in
    certificates.record("fla:gla", device_name())
    got = run()
    assert [c["op"] for c in stand_in] == ["chunk_gla", "chunk_gla"]  # one call per layer
    torch.testing.assert_close(got[0], want[0], rtol=1e-5, atol=1e-5)
    for name, grad in want[1].items():
        torch.testing.assert_close(got[1][name], grad, rtol=1e-4, atol=1e-5, msg=name)
