"""`atlas check` and `atlas plugins new` as commands (mounted on a root app the way the CLI's
`register(app)` functions mount them)."""

import json

import pytest
from typer.testing import CliRunner

from atlas_cli import check as check_cmd
from atlas_cli import scaffold
from atlas_cli.common import AtlasTyper


@pytest.fixture
def app():
    from atlas_cli.common import set_global_format

    set_global_format(None)  # a global --format of an earlier test must not leak into this one
    root = AtlasTyper(name="atlas")

    @root.callback()
    def _root() -> None:
        """test root"""

    check_cmd.register(root)
    from atlas_cli.plugins import plugins_app

    scaffold.register(root)
    scaffold.register(root)  # idempotent: `new` is added once
    root.add_typer(plugins_app, name="plugins")
    return root


def _run(app, *args):
    return CliRunner().invoke(app, list(args))


def test_unknown_namespace_is_one_line_with_a_suggestion(app):
    res = _run(app, "check", "titan")
    assert res.exit_code == 1
    assert res.output.strip() == "error: unknown namespace 'titan'; did you mean 'titans'?"


def test_unknown_component_is_one_line_with_a_suggestion(app):
    res = _run(app, "check", "core:l22")
    assert res.exit_code == 1
    assert res.output.strip().startswith("error: unknown component 'core:l22'; did you mean 'core:l2'")
    assert len(res.output.strip().splitlines()) == 1


def test_component_checks_as_json(app):
    res = _run(app, "check", "core:chunkwise", "--check", "check_causal", "--check",
               "check_params_roundtrip_toml", "--format", "json")
    assert res.exit_code == 0, res.output
    data = json.loads(res.output)
    assert data["ok"] and data["counts"]["passed"] == 2
    assert {(r["case"], r["check"], r["status"]) for r in data["results"]} == {
        ("core:chunkwise", "check_causal", "passed"), ("core:chunkwise", "check_params_roundtrip_toml", "passed")}


def test_human_table_shows_statuses_and_reasons(app):
    res = _run(app, "check", "core:l2", "--check", "check_params_roundtrip_toml", "--check", "check_resolves_by_name")
    assert res.exit_code == 0, res.output
    assert "skipped" in res.output and "core:l2 takes no params" in res.output
    assert "ok: 1 passed, 1 skipped" in res.output


def test_unknown_check_name_is_an_error_with_a_suggestion(app):
    res = _run(app, "check", "core:l2", "--check", "check_causl")
    assert res.exit_code == 1 and "did you mean 'check_causal'" in res.output


def test_catalogue_listing(app):
    res = _run(app, "check", "--list", "--format", "json")
    assert res.exit_code == 0
    names = [row["check"] for row in json.loads(res.output)]
    assert names[0] == "check_resolves_by_name" and "check_reductions" in names


def test_a_plugin_that_failed_to_import_fails_its_check_with_the_error(app, host_with, fake_distribution):
    fake_distribution(dist="kaput-plugin", namespace="kaput", module="kaput_cli_mod",
                      source="raise ImportError('no module named kaput_dep')\n")
    host_with()
    res = _run(app, "check", "kaput", "--format", "json")
    assert res.exit_code == 1
    data = json.loads(res.stdout if hasattr(res, "stdout") else res.output)
    assert not data["ok"]
    failed = [r for r in data["results"] if r["status"] == "failed"]
    assert failed and all("ImportError: no module named kaput_dep" in r["message"] for r in failed)
    # the rest of the installation is unaffected
    assert _run(app, "check", "core:l2", "--check", "check_resolves_by_name").exit_code == 0


def test_plugins_new_writes_a_package_and_refuses_to_overwrite(app, tmp_path):
    res = _run(app, "plugins", "new", "acme_rules", "--dir", str(tmp_path), "--format", "json")
    assert res.exit_code == 0, res.output
    data = json.loads(res.output)
    root = tmp_path / "atlas-acme-rules"
    assert data["path"] == str(root)
    assert sorted(data["files"]) == sorted([
        "pyproject.toml", "README.md", "src/atlas_acme_rules/__init__.py",
        "src/atlas_acme_rules/plugin.py", "src/atlas_acme_rules/scaled_l2.py", "tests/test_conformance.py"])
    assert 'acme_rules = "atlas_acme_rules.plugin"' in (root / "pyproject.toml").read_text()
    again = _run(app, "plugins", "new", "acme_rules", "--dir", str(tmp_path))
    assert again.exit_code == 1 and "exists and is not empty" in again.output


@pytest.mark.parametrize("args, message", [
    (["Acme"], "must be a lowercase identifier"),
    (["core"], "already provided by atlas-ttm"),
    (["test"], "is reserved"),
    (["class"], "must be a lowercase identifier"),
    (["mesa", "--dist", "Acme-Mesa"], "must be lowercase letters and digits"),
    (["mesa", "--dist", "acme-"], "must be lowercase letters and digits"),
    (["mesa", "--dist", "9-mesa"], "is not a Python identifier"),
    (["mesa", "--dist", "plugins"], "generic import name 'plugins'"),
])
def test_plugins_new_refuses_bad_names(app, tmp_path, args, message):
    res = _run(app, "plugins", "new", *args, "--dir", str(tmp_path))
    assert res.exit_code == 1 and message in res.output, res.output
    assert not any(tmp_path.iterdir())


def test_plugins_new_takes_a_distribution_name_apart_from_the_namespace(app, tmp_path):
    res = _run(app, "plugins", "new", "mesa", "--dist", "acme-mesa", "--dir", str(tmp_path), "--format", "json")
    assert res.exit_code == 0, res.output
    data = json.loads(res.output)
    root = tmp_path / "acme-mesa"
    assert (data["path"], data["namespace"], data["distribution"], data["package"]) == (
        str(root), "mesa", "acme-mesa", "acme_mesa")
    assert "src/acme_mesa/plugin.py" in data["files"]
    pyproject = (root / "pyproject.toml").read_text()
    assert 'name = "acme-mesa"' in pyproject and 'mesa = "acme_mesa.plugin"' in pyproject
    plugin = (root / "src" / "acme_mesa" / "plugin.py").read_text()
    assert '"acme_mesa.scaled_l2:build"' in plugin
    assert 'Case("mesa:scaled_l2"' in (root / "tests" / "test_conformance.py").read_text()

