"""What the fla backends refuse, each with its reason: rules no fla op computes (decided from the
rule's declared form), the other op's rules, sizes and dtypes fla does not take, CPU tensors
without the test hook, a machine without CUDA or without fla."""

from __future__ import annotations

import importlib.util

import pytest
import torch

pytest.importorskip("fla.ops")

import atlas_core as ac  # noqa: E402
from atlas_core.host.manager import get_registry  # noqa: E402
from atlas_core.strategies.base import resolve_strategy  # noqa: E402
from atlas_plugins.fla_backend import availability  # noqa: E402
from atlas_plugins.fla_backend.mapping import op_for  # noqa: E402
from tests.fla_backend.calls import call, rule_of  # noqa: E402

KNOBS = {"structure": "core:linear", "algorithm": "core:gd", "feature_map": "core:identity"}


def backend(name):
    return get_registry().build("backend", name)


def verdict(name, rule, strategy="core:exact_chunk", T=9, dtype=torch.float32, B=2):
    """The backend's answer for a call of ``rule`` under ``strategy``."""
    q, k, v, gates, state = call(rule, T, dtype=dtype, B=B)
    strat = resolve_strategy(rule, strategy)
    return backend(name).verify(strat, rule, rule.prepare(q, k, v, gates=gates, state=state))


@pytest.mark.parametrize("spec,strategy,reason", [
    ({"use": "zoo:deltanet", "read": "before"}, "core:exact_chunk", "read = 'before'"),
    ({**KNOBS, "bias": "core:l2", "retention": "core:none", "algorithm": "core:momentum"},
     "core:exact_chunk", "is not core:gd"),
    ({**KNOBS, "bias": "core:dot", "retention": "core:none", "anchor": 4},
     {"use": "core:chunkwise", "chunk_size": 4}, "anchored"),
    ({**KNOBS, "bias": {"use": "omega:window", "window": 4, "inner": "core:l2"}, "retention": "core:none"},
     "core:exact_chunk", "window of 4 tokens"),
    ({**KNOBS, "bias": "core:l2", "retention": "core:decay"}, "core:exact_chunk", "Titans' order"),
    ({**KNOBS, "bias": "core:l2", "retention": "zoo:key_decay"}, "core:exact_chunk", "Titans' order"),
], ids=["read-before", "momentum", "anchored", "omega-window", "l2-decay-current", "l2-key-decay-current"])
def test_rules_no_fla_op_computes_are_refused(stand_in, spec, strategy, reason):
    rule = ac.build_rule(spec, heads=2, d_key=16, d_value=16)
    for name in ("fla:delta_rule", "fla:gated_delta_rule", "fla:kda", "fla:gla", "fla:simple_gla"):
        ok, why = verdict(name, rule, strategy)
        assert not ok and reason in why, (name, why)
    assert not stand_in  # nothing ran


def test_each_backend_refuses_the_other_ops_rules(stand_in):
    ok, why = verdict("fla:gla", rule_of("zoo:deltanet"))
    assert not ok and why == ("fla's chunk_delta_rule computes this rule (backend fla:delta_rule), "
                              "not chunk_gla")
    ok, why = verdict("fla:delta_rule", rule_of("zoo:kda"))
    assert not ok and "chunk_kda computes this rule (backend fla:kda)" in why
    assert verdict("fla:kda", rule_of("zoo:kda")) == (True, "")


def test_op_of_every_bundled_preset():
    """The decision table over every rule preset: the mapped ones and nothing else."""
    want = {"zoo:deltanet": "delta_rule", "zoo:longhorn": "delta_rule",
            "zoo:gated_deltanet": "gated_delta_rule", "zoo:gated_delta_product": "gated_delta_rule",
            "zoo:kda": "kda", "zoo:gla": "gla", "zoo:simple_gla": "simple_gla",
            "zoo:retnet": "simple_gla", "zoo:linear_attention": "simple_gla"}
    got = {}
    for comp in get_registry().all("rule"):
        try:
            rule = ac.build_rule(comp.name, heads=2, d_key=16, d_value=16)
        except Exception:  # noqa: BLE001 - a preset that needs more than these sizes
            continue
        op, why = op_for(rule.form)
        if op is not None:
            got[comp.name] = op
        else:
            assert why, comp.name
    assert got == want


@pytest.mark.parametrize("d_key,d_value,reason", [(8, 16, "below 16"), (16, 8, "below 16"),
                                                  (272, 16, "exceeds 256")])
def test_head_dims_fla_does_not_take_are_refused(stand_in, d_key, d_value, reason):
    rule = ac.build_rule("zoo:kda", heads=1, d_key=d_key, d_value=d_value)
    q = torch.randn(1, 3, 1, d_key)
    k = torch.nn.functional.normalize(torch.randn(1, 3, 1, d_key), dim=-1)
    gates = {"alpha": torch.rand(1, 3, 1, d_key), "theta": torch.rand(1, 3, 1)}
    p = rule.prepare(q, k, torch.randn(1, 3, 1, d_value), gates=gates)
    ok, why = backend("fla:kda").verify(resolve_strategy(rule, "core:exact_chunk"), rule, p)
    assert not ok and reason in why


def test_float64_is_refused(stand_in):
    ok, why = verdict("fla:gla", rule_of("zoo:gla"), dtype=torch.float64)
    assert not ok and "dtype torch.float64" in why


def test_an_empty_sequence_is_refused(stand_in):
    ok, why = verdict("fla:gla", rule_of("zoo:gla"), T=0)
    assert (ok, why) == (False, "the sequence is empty")


def test_the_cpu_without_the_test_hook(certs):
    """This machine has no GPU: without the hook the backends are unavailable, their verifier
    refuses CPU tensors, and the rule runs its PyTorch code."""
    assert not torch.cuda.is_available() and availability.stand_in() is None
    assert backend("fla:gla").is_available() == (False, "no CUDA device (fla's chunk ops are Triton GPU kernels)")
    ok, why = verdict("fla:gla", rule_of("zoo:gla"))
    assert not ok and why == "tensors are on cpu; fla's chunk kernels need CUDA tensors"


def test_without_fla_installed(stand_in, monkeypatch):
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "fla" else real(name, *a))
    ok, why = backend("fla:kda").is_available()
    assert not ok and why.startswith("flash-linear-attention is not installed")


def test_the_hook_needs_a_label():
    with pytest.raises(ValueError, match="label"):
        with availability.cpu_stand_in(""):
            pass
    assert availability.stand_in() is None
