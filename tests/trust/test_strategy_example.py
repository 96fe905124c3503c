"""docs/plugins.md's strategy example ("Writing a strategy") as a package: it refuses a standalone
rule with a reason, runs every bundled preset exactly as core:sequential does, and passes the
kit's strategy checks on the rules it declares (tests/test_docs_commands.py runs the doc's own
`atlas check acme_chunks` too); the hostile greedy:zeros fails its own certification, as its own
failure."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import torch

from atlas_core.errors import StrategyError
from atlas_core.host import manager
from atlas_core.host.manager import PluginHost
from atlas_core.rule import build_rule
from atlas_core.strategies.base import resolve_strategy
from atlas_core.testing import Case, check_component, strategy_cases
from atlas_core.testing import inputs as I

DOC = Path(__file__).resolve().parents[2] / "docs" / "plugins.md"


@pytest.fixture
def chunks(tmp_path, monkeypatch):
    blocks = re.findall(r"```python\n# src/atlas_acme_chunks/(\w+\.py)\n(.*?)```", DOC.read_text(), re.S)
    assert [name for name, _ in blocks] == ["plugin.py", "chunked.py"]
    pkg = tmp_path / "atlas_acme_chunks"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    for name, code in blocks:
        (pkg / name).write_text(code)
    info = tmp_path / "atlas_acme_chunks-0.1.0.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: atlas-acme-chunks\nVersion: 0.1.0\n")
    (info / "entry_points.txt").write_text("[atlas_core.plugins]\nacme_chunks = atlas_acme_chunks.plugin\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    old = manager._HOST
    host = PluginHost(strict=True).load_entry_points()
    manager.reset_host(host)
    yield host
    manager.reset_host(old)


def test_the_example_is_exact_on_every_bundled_preset_with_a_chunked_form_and_refuses_the_rest(chunks):
    cases = strategy_cases("acme_chunks:chunked", params={"chunk_size": 3})
    assert len(cases) >= 10 and cases[0].rule["structure"] == "core:linear"
    ran, refused = [], []
    for case in cases[1:]:
        rule = build_rule(case.rule, heads=2, d_key=4, d_value=4).to(torch.float64)
        if not rule.form.chunk_forms:  # no exact chunked form: only core:sequential runs it
            with pytest.raises(StrategyError, match="runs rules with a chunked form; this one has none"):
                resolve_strategy(rule, "acme_chunks:chunked")
            refused.append(case.rule)
            continue
        flat = I.composed_inputs(rule, 2, 8, dtype=torch.float64, device="cpu", seed=3)
        with torch.no_grad():
            y, state = rule(**I.unflatten(flat), strategy={"use": "acme_chunks:chunked", "chunk_size": 3})
            y_ref, state_ref = rule(**I.unflatten(flat), strategy="core:sequential")
        assert torch.allclose(y, y_ref, rtol=0, atol=1e-12), case.rule
        assert all(torch.allclose(state[k], state_ref[k], rtol=0, atol=1e-12) for k in state_ref), case.rule
        ran.append(case.rule)
    assert "zoo:rwkv7" in refused and len(ran) >= 10, (ran, refused)
    with pytest.raises(StrategyError, match="runs knob-composed rules; this one is standalone"):
        resolve_strategy(build_rule({"use": "mru:mru"}), "acme_chunks:chunked")


def test_the_example_passes_its_declared_checks(chunks):
    comp = chunks.registry.get("strategy", "acme_chunks:chunked")
    assert [c["rule"] for c in comp.extra["check_cases"]] == ["zoo:deltanet", "titans:titans_deep", "omega:omeganet"]
    results = check_component(Case("acme_chunks:chunked", rule="titans:titans_deep"), on_fail="collect")
    assert {r.status for r in results} <= {"passed", "skipped"}, [r.message for r in results if r.status == "failed"]
    match = next(r for r in results if r.name == "check_strategies_match_sequential")
    assert match.status == "passed" and "acme_chunks:chunked(chunk_size=3)" in match.notes[0]


def test_the_hostile_strategy_fails_its_own_certification_as_its_own_failure(greedy):
    res, = check_component(Case("greedy:zeros", rule="zoo:deltanet"), on_fail="collect",
                           checks=["check_strategies_match_sequential"])
    assert res.status == "failed" and res.blame == "greedy:zeros@zoo:deltanet"  # the case itself
    assert res.message.startswith("check_strategies_match_sequential [greedy:zeros@zoo:deltanet] failed")
    # claiming every rule: the first rule of the sweep is the default composition, where its zeros
    # differ from core:sequential (before any rule without a chunked form comes up)
    sweep, = check_component(Case("greedy:zeros", rule="zoo:deltanet"), on_fail="collect",
                             checks=["check_strategy_on_every_rule"])
    assert sweep.status == "failed" and sweep.blame == "greedy:zeros@zoo:deltanet"
    assert ("greedy:zeros differs from core:sequential on the default composition: y differs (max abs diff="
            in sweep.message), sweep.message


def test_the_rule_methods_strategies_call_are_public_and_the_old_names_still_work():
    from atlas_core.rule import ComposedRule

    rule = build_rule("omega:omeganet", heads=2, d_key=4, d_value=4).to(torch.float64)  # window c = 8
    flat = I.composed_inputs(rule, 1, 5, dtype=torch.float64, device="cpu", seed=0)
    p = rule.prepare(**I.unflatten(flat))
    xk, xv, xg = rule.extended_inputs(p)
    assert xk.shape[2] == rule.window - 1 + 5 and xg.shape == (1, 2, rule.window - 1 + 5)
    assert all(torch.equal(a, b) for a, b in zip(rule._extended(p), (xk, xv, xg)))
    W = {k: p.state[k] for k in rule.structure.weight_shapes()}
    opt = {k: p.state[k] for k in rule.algorithm.init_opt(W)}
    state = rule.final_state(W, opt, xk, xv, xg)
    assert set(state) == set(p.state) and torch.equal(state["window.k"], xk[:, :, -(rule.window - 1):])
    assert ComposedRule._final_state is ComposedRule.final_state
