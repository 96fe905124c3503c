"""``"auto"`` never chooses a third-party strategy the user did not allow.

With atlas-acme-greedy installed (``greedy:zeros``: claims every rule at priority 1000, returns
zeros): ``"auto"`` on every bundled preset computes what ``core:sequential`` computes, and no rule
or spec resolves to it; naming it runs it; allowing its namespace (in the spec or in the
environment) makes it a candidate after the bundled strategies (the default spec still runs
core:exact_chunk), ranking it before ``"bundled"`` makes ``"auto"`` choose it; either says so
once, with why, and the spec and start line name it with its distribution.
"""

from __future__ import annotations

import logging
from pathlib import Path

import pytest
import torch

from atlas_core.errors import SpecError
from atlas_core.rule import build_rule
from atlas_core.spec.memory import resolve_memory
from atlas_core.strategies import trust
from atlas_core.strategies.base import resolve_strategy
from atlas_core.testing import inputs as I

ROOT = Path(__file__).resolve().parents[2]


def _bundled(host, kind="rule"):
    return [c for c in host.registry.all(kind) if trust.bundled(c)]


def _call(rule, strategy, seed=0):
    flat = I.composed_inputs(rule, 2, 7, dtype=torch.float64, device="cpu", seed=seed)
    with torch.no_grad():
        return rule(**I.unflatten(flat), strategy=strategy)


def test_auto_on_every_bundled_preset_equals_sequential(greedy):
    presets = [c for c in _bundled(greedy) if "preset" in c.capabilities]
    assert len(presets) >= 10
    for comp in presets:
        rule = build_rule(comp.name, heads=2, d_key=4, d_value=4).to(torch.float64)
        assert rule.runner("auto").name != "greedy:zeros", comp.name
        y, state = _call(rule, "auto")
        y_ref, state_ref = _call(rule, "core:sequential")
        scale = max(1.0, float(y_ref.abs().max()))
        assert float((y - y_ref).abs().max()) <= 1e-8 * scale, comp.name
        assert float(y_ref.abs().max()) > 0, comp.name
        for key in state_ref:
            assert torch.allclose(state[key], state_ref[key], atol=1e-8 * scale, rtol=0), (comp.name, key)


def test_no_bundled_rule_or_spec_without_parallel_resolves_to_it(greedy):
    for comp in _bundled(greedy):
        issues = []
        table = resolve_memory({"use": comp.name}, greedy.registry, issues)
        if table is None:  # a standalone rule whose required params the bare name lacks
            continue
        assert table["parallel"]["use"] != "greedy:zeros", comp.name
    rule = build_rule("zoo:deltanet", heads=2, d_key=4, d_value=4)
    assert resolve_strategy(rule, {"use": "auto"}).name == "core:exact_chunk"


def test_naming_it_explicitly_runs_it(greedy):
    rule = build_rule("zoo:deltanet", heads=2, d_key=4, d_value=4).to(torch.float64)
    y, state = _call(rule, "greedy:zeros")
    assert not y.any() and not state["M"].any()
    issues = []
    table = resolve_memory({"use": "zoo:deltanet", "parallel": "greedy:zeros"}, greedy.registry, issues)
    assert not issues and table["parallel"] == {"use": "greedy:zeros"}


def test_allowing_its_namespace_makes_it_a_candidate_not_a_winner(greedy, caplog):
    # priority 1000 does not outrank the bundled strategies: the delta rule stays core:exact_chunk
    caplog.set_level(logging.WARNING, logger="atlas_core.strategies")
    issues = []
    table = resolve_memory({"use": "zoo:deltanet", "parallel": {"use": "auto", "allow": ["greedy"]}},
                           greedy.registry, issues)
    assert not issues and table["parallel"]["use"] == "core:exact_chunk"
    # ... and it runs the rules no bundled strategy runs (a per-token transition: RWKV-7)
    table = resolve_memory({"use": "zoo:rwkv7", "parallel": {"use": "auto", "allow": ["greedy"]}},
                           greedy.registry, issues)
    assert not issues and table["parallel"] == {"use": "greedy:zeros"}
    said = [r.getMessage() for r in caplog.records if "third-party strategy" in r.getMessage()]
    assert len(said) == 1, said
    assert ("greedy:zeros (atlas-acme-greedy 0.1.0, third-party), allowed by allow = ['greedy'], "
            "ranked after the bundled strategies (none of them runs this rule)") in said[0]
    # without the allow entry, core:sequential runs it
    assert resolve_memory({"use": "zoo:rwkv7"}, greedy.registry, issues)["parallel"] == {"use": "core:sequential"}


def test_ranking_it_before_the_bundled_ones_lets_auto_choose_it_and_says_so_once(greedy, caplog):
    caplog.set_level(logging.WARNING, logger="atlas_core.strategies")
    for _ in range(2):
        issues = []
        table = resolve_memory({"use": "zoo:deltanet",
                                "parallel": {"use": "auto", "allow": ["greedy", "bundled"]}},
                               greedy.registry, issues)
        assert not issues and table["parallel"] == {"use": "greedy:zeros"}
    said = [r.getMessage() for r in caplog.records if "third-party strategy" in r.getMessage()]
    assert len(said) == 1, said
    assert "greedy:zeros (atlas-acme-greedy 0.1.0, third-party)" in said[0]
    assert "allowed by allow = ['greedy', 'bundled'], ranked before the bundled strategies" in said[0]
    # the user's order decides: "bundled" first is the default order
    issues = []
    table = resolve_memory({"use": "zoo:deltanet", "parallel": {"use": "auto", "allow": ["bundled", "greedy"]}},
                           greedy.registry, issues)
    assert not issues and table["parallel"]["use"] == "core:exact_chunk"


def test_the_ranking_orders_the_bundled_by_priority_and_the_allowed_by_the_users_order(greedy):
    comps = list(greedy.registry.all("strategy"))
    order, passed = trust.ranked(comps, ())
    names = [c.name for c, _ in order]
    assert "core:sequential" not in names and [c.name for c in passed] == ["greedy:zeros"]
    assert names == sorted(names, key=lambda n: -greedy.registry.get("strategy", n).priority)
    assert names.index("core:chunkwise") < names.index("core:exact_chunk")  # 10 before 5
    order, passed = trust.ranked(comps, ("greedy",))
    assert not passed and order[-1][0].name == "greedy:zeros"
    order, _ = trust.ranked(comps, ("greedy:zeros", "bundled"))
    assert order[0][0].name == "greedy:zeros"


def test_allowing_it_in_the_environment(greedy, monkeypatch, caplog):
    caplog.set_level(logging.WARNING, logger="atlas_core.strategies")
    rule = build_rule("zoo:deltanet", heads=2, d_key=4, d_value=4).to(torch.float64)
    monkeypatch.setenv(trust.ALLOW_ENV, "greedy:zeros")
    assert rule.runner("auto").name == "core:exact_chunk"  # a candidate
    rule = build_rule("zoo:deltanet", heads=2, d_key=4, d_value=4).to(torch.float64)
    monkeypatch.setenv(trust.ALLOW_ENV, "greedy:zeros,bundled")  # ranked first
    y, _ = _call(rule, "auto")
    assert not y.any()
    said = [r.getMessage() for r in caplog.records if "third-party strategy" in r.getMessage()]
    assert len(said) == 1 and f"allowed by {trust.ALLOW_ENV}=greedy:zeros,bundled" in said[0]


def test_the_default_spec_runs_exact_chunk_unless_the_user_ranks_the_allowed_strategy_first(greedy, monkeypatch):
    """The issue's bar: a third-party strategy declaring priority 1000, allowed by namespace, does
    not displace core:exact_chunk from `atlas train`'s default spec."""
    from atlas_core.spec import load_spec

    assert greedy.registry.get("strategy", "greedy:zeros").priority == 1000
    default = ROOT / "examples" / "mqar_default.toml"
    monkeypatch.setenv(trust.ALLOW_ENV, "greedy")
    assert load_spec(default).memory["parallel"]["use"] == "core:exact_chunk"
    text = default.read_text().replace('use = "zoo:deltanet"',
                                       'use = "zoo:deltanet"\nparallel = { use = "auto", allow = ["greedy"] }')
    assert 'allow = ["greedy"]' in text
    monkeypatch.delenv(trust.ALLOW_ENV)
    assert load_spec(text).memory["parallel"]["use"] == "core:exact_chunk"
    ranked_first = text.replace('allow = ["greedy"]', 'allow = ["greedy", "bundled"]')
    assert load_spec(ranked_first).memory["parallel"] == {"use": "greedy:zeros"}
    monkeypatch.setenv(trust.ALLOW_ENV, "greedy,bundled")
    assert load_spec(default).memory["parallel"] == {"use": "greedy:zeros"}


@pytest.mark.parametrize("bad, path", [
    ({"use": "auto", "alow": ["greedy"]}, "memory.parallel.alow"),
    ({"use": "auto", "allow": "greedy"}, "memory.parallel.allow"),
])
def test_a_bad_auto_table_names_the_key(greedy, bad, path):
    issues = []
    assert resolve_memory({"use": "zoo:deltanet", "parallel": bad}, greedy.registry, issues) is None
    assert [i.path for i in issues] == [path]
    with pytest.raises(SpecError):
        resolve_strategy(build_rule("zoo:deltanet"), bad)


def test_the_resolved_spec_names_the_strategy_and_its_distribution(greedy):
    from atlas_core.spec import load_spec

    spec = load_spec(dict(SPEC, memory={"use": "zoo:deltanet"}))
    head = spec.to_toml().splitlines()[:2]
    assert head[1].startswith("# parallel: core:exact_chunk (") and "third-party" not in head[1], head
    allowed = load_spec(dict(SPEC, memory={"use": "zoo:deltanet",
                                           "parallel": {"use": "auto", "allow": ["greedy", "bundled"]}}))
    assert "# parallel: greedy:zeros (atlas-acme-greedy 0.1.0, third-party)" in allowed.to_toml()
    assert load_spec(allowed.to_toml()) == allowed  # the saved spec names it: it rebuilds the same


SPEC = {
    "schema": "atlas/1",
    "name": "trust",
    "model": {"arch": "core:lm", "vocab_size": 16, "d_model": 16, "depth": 1, "heads": 2, "mlp_ratio": 2.0},
    "memory": {"use": "zoo:deltanet"},
    "train": {"task": {"use": "mqar", "num_pairs": 2, "seq_len": 16}, "steps": 1, "batch_size": 2,
              "lr": 3e-3, "warmup_steps": 1, "eval_every": 1, "eval_batches": 1, "log_every": 1,
              "seed": 0, "device": "cpu"},
}
