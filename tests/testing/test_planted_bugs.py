"""A plugin package with switchable planted bugs (tests/plugin_pkgs/acme_planted, namespace
``planted``): ``atlas check planted`` passes on the clean package and fails on every bug, each
caught by a named check whose message states the clause and the numbers.

The package is installed in-process (`fake_install`) and the bug planted through its switch,
``ACME_PLANTED_BUG`` (read on every call). Each bug's run restricts ``atlas check planted`` to the
check that must catch it (``--check``): the full command runs that check among the others on the
same deterministic inputs, so it fails too; the clean package's full run shows every check passes.
"""

from __future__ import annotations

import json

import pytest
from typer.testing import CliRunner

from atlas_cli.main import make_app
from tests.plugin_pkgs.fake_install import installed_host

BUG_ENV = "ACME_PLANTED_BUG"
MESA = "planted:mesa(lam=0.5)"
CHUNKS = "planted:mesa_chunks@{lam=0.5,use=planted:mesa}"


@pytest.fixture
def planted(tmp_path, monkeypatch):
    """The host with atlas-acme-planted installed (no bug planted), as the process-wide one."""
    monkeypatch.delenv(BUG_ENV, raising=False)
    with installed_host("acme_planted", "planted", tmp_path / "site", monkeypatch) as host:
        yield host


def _check(*args: str) -> tuple[int, list[dict]]:
    res = CliRunner().invoke(make_app(), ["--format", "json", "check", "planted", *args])
    assert res.exit_code in (0, 1), res.output[-3000:]
    return res.exit_code, json.loads(res.stdout)["results"]


def test_the_clean_package_passes_atlas_check(planted):
    code, rows = _check()
    bad = [(r["case"], r["check"], r["message"][:300]) for r in rows if r["status"] not in ("passed", "skipped")]
    assert code == 0 and not bad, bad
    ran = {(r["case"], r["check"]) for r in rows if r["status"] == "passed"}
    # the checks that catch the bugs below ran on the clean package and passed
    for case, check in [(CHUNKS, "check_default_chunk_size"), (MESA, "check_default_chunk_size"),
                        (CHUNKS, "check_strategy_on_every_rule"), (CHUNKS, "check_strategies_match_sequential"),
                        (MESA, "check_boundary_inputs"), ("planted:rho_keep", "check_boundary_inputs"),
                        (CHUNKS, "check_gradcheck_float64")]:
        assert (case, check) in ran, (case, check)
    skipped = {(r["case"], r["check"]) for r in rows if r["status"] == "skipped"}
    assert skipped == {("planted:rho_keep", "check_params_roundtrip_toml"),
                       ("planted:rho_delta", "check_params_roundtrip_toml")}  # no params to write
    sweep = next(r for r in rows if r["check"] == "check_strategy_on_every_rule")
    assert "equal to core:sequential on 1 rules (planted:mesa)" in sweep["notes"][0]
    assert "mru:mru" in sweep["notes"][0] and "zoo:rwkv7" in sweep["notes"][0]  # refused, as it must


# bug -> (the check that catches it, the case it fails, what its message says)
BUGS = {
    "wrong_large_chunk": ("check_default_chunk_size", CHUNKS, [
        "planted:mesa_chunks(chunk_size=64: its default) differs from core:sequential over 160 tokens: "
        "chunks of 64, the last of 32: y differs (max abs diff=", "tolerance=",
        "Contract: every strategy runs at its own default chunk size D"]),
    "ignores_state": ("check_strategies_match_sequential", CHUNKS, [
        "planted:mesa_chunks(chunk_size=1) differs from core:sequential (non-zero initial state)",
        "max abs diff=", "Contract: every strategy that accepts a rule computes what core:sequential"]),
    "claims_every_rule": ("check_strategy_on_every_rule", CHUNKS, [
        "planted:mesa_chunks accepts ", "a strategy must refuse what it cannot run as a chunked computation",
        "supports() -> (False, reason)", "Contract: a strategy, against every rule the environment has"]),
    "claims_standalone": ("check_strategy_on_every_rule", CHUNKS, [
        "planted:mesa_chunks accepts mru:mru (atlas-ttm", "it is a standalone rule of another plugin ('mru')",
        "rule=mru:mru", "Contract: a strategy, against every rule the environment has"]),
    "detached_grad": ("check_gradcheck_float64", CHUNKS, [
        "carry no gradient under planted:mesa_chunks(chunk_size=3) (they do under core:sequential)",
        "sizes=B=1 T=3 H=1 Dk=2 Dv=2", "Contract: torch.autograd.gradcheck passes"]),
    "gate_edge_nan": ("check_boundary_inputs", "planted:rho_keep", [
        "the gradient of input gates.rho has 18 non-finite entries in the boundary case 'rho = 1'",
        "dtype=float64", "Contract: on boundary inputs"]),
    "standalone_gate_edge_nan": ("check_boundary_inputs", MESA, [
        "the output y has 72 non-finite entries in the boundary case 'forget = 1'",
        "strategy=core:sequential", "Contract: on boundary inputs"]),
}


@pytest.mark.parametrize("bug", sorted(BUGS))
def test_atlas_check_fails_on_each_planted_bug_with_the_named_check(planted, monkeypatch, bug):
    from atlas_acme_planted.bugs import BUGS as PLANTABLE

    assert set(BUGS) == set(PLANTABLE)  # every bug the package can plant is tested here
    check, case, says = BUGS[bug]
    monkeypatch.setenv(BUG_ENV, bug)
    code, rows = _check("--check", check)
    failed = {r["case"]: r for r in rows if r["status"] == "failed"}
    assert code == 1 and case in failed, [(r["case"], r["status"]) for r in rows]
    msg = failed[case]["message"]
    assert msg.startswith(f"{check} [{case}] failed: "), msg
    for text in says:
        assert text in msg, (text, msg)
    assert msg.endswith(f"See docs/plugins.md#{check}")


def test_the_old_blind_spots_pass_the_old_checks(planted, monkeypatch):
    """What the new checks add: a strategy wrong only at large chunks, or claiming a standalone rule
    it runs by that rule's own loop, passes the equivalence checks at chunk sizes 1 and 3."""
    for bug in ("wrong_large_chunk", "claims_standalone"):
        monkeypatch.setenv(BUG_ENV, bug)
        code, rows = _check("--check", "check_strategies_match_sequential", "--check", "check_split_calls",
                            "--check", "check_gradients_match_reference")
        assert code == 0 and {r["status"] for r in rows} == {"passed"}, (bug, rows)


def test_core_lm_hosts_the_standalone_rule_and_auto_takes_its_own_strategy_when_allowed(planted):
    """docs/plugins.md's walkthrough: the rule's params in [memory], its gates' biases in [layer];
    "auto" is core:sequential (the bundled strategies refuse a standalone rule) unless the
    plugin's namespace is allowed, and then its own strategy, the only candidate, runs it."""
    import torch

    from atlas_core import build_model
    from atlas_core.spec import load_spec

    spec = {"schema": "atlas/1", "name": "mesa",
            "model": {"arch": "core:lm", "vocab_size": 16, "d_model": 16, "depth": 1, "heads": 2},
            "memory": {"use": "planted:mesa", "lam": 0.5}, "layer": {"gate_bias": {"forget": 3.0}}}
    plain = load_spec(spec)
    assert plain.memory["lam"] == 0.5 and plain.memory["parallel"] == {"use": "core:sequential"}
    allowed = load_spec({**spec, "memory": {**spec["memory"], "parallel": {"use": "auto", "allow": ["planted"]}}})
    assert allowed.memory["parallel"] == {"use": "planted:mesa_chunks", "chunk_size": 64}
    ids = torch.randint(0, 16, (2, 9), generator=torch.Generator().manual_seed(0))
    logits = {}
    for name, s in (("sequential", plain), ("chunks", allowed)):
        torch.manual_seed(0)
        model = build_model(s).double()
        layer = next(m for m in model.modules() if type(m).__name__ == "MemoryLayer")
        assert layer.gate_names == ("forget", "write")
        logits[name] = model(ids)
    assert torch.allclose(logits["chunks"], logits["sequential"], rtol=0, atol=1e-10)
