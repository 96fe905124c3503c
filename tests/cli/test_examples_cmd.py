"""`atlas examples list|copy`: the example specs that ship with the package."""

from __future__ import annotations

import json
from pathlib import Path

from typer.testing import CliRunner

from atlas_cli.main import make_app
from atlas_core.example_specs import examples_dir, list_examples

runner = CliRunner()
REPO_EXAMPLES = Path(__file__).resolve().parents[2] / "examples"


def invoke(args):
    return runner.invoke(make_app(plugin_apps=False), args, catch_exceptions=False)


def test_every_repository_example_is_listed_with_its_summary():
    names = {r["name"] for r in list_examples()}
    assert names == {p.stem for p in REPO_EXAMPLES.glob("*.toml")}
    r = invoke(["--format", "json", "examples", "list"])
    assert r.exit_code == 0, r.output
    rows = {row["name"]: row for row in json.loads(r.stdout)}
    assert rows["titans_lmm"]["summary"] and "MFLOP" in rows["titans_lmm"]["cost"]
    assert (examples_dir() / "titans_lmm.toml").is_file()


def test_copy_writes_the_named_specs_and_refuses_to_overwrite(tmp_path):
    r = invoke(["examples", "copy", str(tmp_path), "--name", "titans_lmm", "--name", "zoo_gla"])
    assert r.exit_code == 0, r.output
    assert sorted(p.name for p in tmp_path.iterdir()) == ["titans_lmm.toml", "zoo_gla.toml"]
    assert (tmp_path / "zoo_gla.toml").read_bytes() == (REPO_EXAMPLES / "zoo_gla.toml").read_bytes()
    again = invoke(["--format", "json", "examples", "copy", str(tmp_path), "--name", "zoo_gla"])
    assert again.exit_code == 1 and "--force" in json.loads(again.stdout)["error"]["message"]
    assert invoke(["examples", "copy", str(tmp_path), "--name", "zoo_gla", "--force"]).exit_code == 0
    bad = invoke(["examples", "copy", str(tmp_path), "--name", "titan_lmm"])
    assert bad.exit_code == 2 and "did you mean 'titans_lmm'" in bad.output
