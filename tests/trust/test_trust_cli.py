"""The commands with the hostile package installed: `atlas check zoo:deltanet` passes (the kit
compares under the bundled strategies), `--strategy greedy` blames the strategy, `atlas spec show`
and the `atlas train` start line name the strategy chosen, with its distribution."""

from __future__ import annotations

import json
import logging

from typer.testing import CliRunner

from atlas_cli.main import make_app
from atlas_core.spec import dump_toml
from tests.trust.test_auto_trust import SPEC

runner = CliRunner()


def invoke(*args):
    return runner.invoke(make_app(), [str(a) for a in args])


def test_atlas_check_of_a_bundled_rule_passes_and_lists_what_it_compared(greedy):
    res = invoke("--format", "json", "check", "zoo:deltanet")
    assert res.exit_code == 0, res.output[-3000:]
    rows = json.loads(res.stdout)["results"]
    assert {r["status"] for r in rows} <= {"passed", "skipped"}
    match = next(r for r in rows if r["check"] == "check_strategies_match_sequential")
    text = " ".join(match["notes"])
    assert "compared with core:sequential: core:chunkwise(chunk_size=1)" in text
    assert "core:exact_chunk(chunk_size=3)" in text and "greedy" not in text


def test_checking_under_the_third_party_strategy_blames_it(greedy):
    res = invoke("--format", "json", "check", "zoo:deltanet", "--strategy", "greedy",
                 "--check", "check_strategies_match_sequential", "--check", "check_causal")
    assert res.exit_code == 1, res.output[-3000:]
    rows = json.loads(res.stdout)["results"]
    failed = [r for r in rows if r["status"] == "failed"]
    assert [r["check"] for r in failed] == ["check_strategies_match_sequential"]
    assert failed[0]["blame"] == "greedy:zeros" and failed[0]["strategy"] == "greedy:zeros"
    assert failed[0]["message"].startswith(
        "the third-party strategy greedy:zeros (atlas-acme-greedy 0.1.0, third-party) fails this check "
        "on zoo:deltanet")
    human = invoke("check", "zoo:deltanet", "--strategy", "greedy", "--check", "check_strategies_match_sequential")
    assert "greedy:zeros's" in human.stdout


def test_spec_show_and_the_train_start_line_name_the_strategy(greedy, tmp_path, caplog):
    plain = tmp_path / "plain.toml"
    plain.write_text(dump_toml(SPEC))
    shown = invoke("spec", "show", plain)
    assert shown.exit_code == 0, shown.output
    assert "# parallel: core:exact_chunk (" in shown.stdout and "greedy" not in shown.stdout
    allowed = tmp_path / "allowed.toml"
    allowed.write_text(dump_toml(dict(SPEC, memory={"use": "zoo:deltanet",
                                                    "parallel": {"use": "auto", "allow": ["greedy", "bundled"]}})))
    caplog.set_level(logging.WARNING, logger="atlas_core.strategies")
    res = invoke("train", allowed, "--out", tmp_path / "run", "--no-progress")
    assert res.exit_code == 0, res.output[-3000:]
    start = next(line for line in res.stderr.splitlines() if line.startswith("train: run "))
    assert start.endswith("; parallel: greedy:zeros (atlas-acme-greedy 0.1.0, third-party)"), start
    said = [r for r in caplog.records if "third-party strategy greedy:zeros" in r.getMessage()]
    assert len(said) == 1
    saved = (tmp_path / "run" / "spec.toml").read_text()
    assert "# parallel: greedy:zeros (atlas-acme-greedy 0.1.0, third-party)" in saved
    assert 'use = "greedy:zeros"' in saved


def test_spec_show_json_names_the_strategy_and_its_distribution(greedy, tmp_path):
    plain, allowed = tmp_path / "plain.toml", tmp_path / "allowed.toml"
    plain.write_text(dump_toml(SPEC))
    allowed.write_text(dump_toml(dict(SPEC, memory={"use": "zoo:deltanet",
                                                    "parallel": {"use": "auto", "allow": ["greedy", "bundled"]}})))
    shown = {}
    for name, path in (("plain", plain), ("allowed", allowed)):
        res = invoke("--format", "json", "spec", "show", path)
        assert res.exit_code == 0, res.output
        shown[name] = json.loads(res.stdout)
        toml_text = invoke("spec", "show", path).stdout
        assert f"spec_hash = {shown[name]['_resolved']['spec_hash']}" in toml_text
    assert shown["plain"]["_resolved"]["parallel"] == {
        "strategy": "core:exact_chunk", "distribution": "atlas-ttm",
        "version": shown["plain"]["_resolved"]["parallel"]["version"], "third_party": False}
    third = shown["allowed"]["_resolved"]["parallel"]
    assert third["strategy"] == "greedy:zeros" and third["distribution"] == "atlas-acme-greedy"
    assert third["third_party"] is True
    assert shown["allowed"]["memory"]["parallel"]["use"] == "greedy:zeros"
