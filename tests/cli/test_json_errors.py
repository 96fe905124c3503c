"""Errors under ``--format json``: one JSON object on stdout ({"error": {...}}), a non-zero exit,
for every command that has ``--format``; human mode keeps one line on stderr."""

from __future__ import annotations

import json

import pytest
import typer
from typer.testing import CliRunner

from atlas_cli.main import make_app
from atlas_core.spec import dump_toml
from tests.train.conftest import TINY

runner = CliRunner()


def invoke(args):
    return runner.invoke(make_app(plugin_apps=False), [str(a) for a in args])


def json_error(result, exit_code: int) -> dict:
    assert result.exit_code == exit_code, result.output
    data = json.loads(result.stdout)  # the whole of stdout is one JSON object
    assert set(data) == {"error"}
    err = data["error"]
    assert set(err) >= {"type", "message", "exit_code", "problems"}
    assert err["exit_code"] == exit_code and err["message"]
    return err


def _commands_with_format():
    """Every command of the built-in app with a --format option, as its word path."""
    root = typer.main.get_command(make_app(plugin_apps=False))
    found = []

    def walk(cmd, path):
        subs = getattr(cmd, "commands", None)
        if subs:
            for name, sub in subs.items():
                walk(sub, path + [name])
        elif any("--format" in getattr(p, "opts", ()) for p in cmd.params):
            found.append(path)

    walk(root, [])
    return found


COMMANDS = _commands_with_format()


def test_the_walk_finds_the_commands():
    names = {" ".join(p) for p in COMMANDS}
    assert {"train", "eval", "generate", "compare", "build", "spec show", "spec validate",
            "components list", "check", "env"} <= names


@pytest.mark.parametrize("path", COMMANDS, ids=lambda p: " ".join(p))
@pytest.mark.parametrize("where", ["global", "command"])
def test_a_usage_error_is_json(path, where):
    if where == "global":
        args = ["--format", "json", *path, "--no-such-option"]
    else:
        args = [*path, "--no-such-option", "--format", "json"]
    err = json_error(invoke(args), 2)
    assert err["type"] == "NoSuchOption" and "--no-such-option" in err["message"]


@pytest.mark.parametrize("args", [["nosuchcommand"], ["spec", "nosuchcommand"]])
def test_an_unknown_command_is_json(args):
    err = json_error(invoke(["--format", "json", *args]), 2)
    assert "No such command 'nosuchcommand'" in err["message"]
    human = invoke(args)
    assert human.exit_code == 2 and human.stdout == "" and "No such command" in human.stderr


@pytest.fixture
def tiny_file(tmp_path):
    path = tmp_path / "tiny.toml"
    path.write_text(dump_toml(TINY))
    return path


def test_spec_errors_list_their_problems(tiny_file):
    err = json_error(invoke(["--format", "json", "train", tiny_file, "model.d_modle=8",
                             "train.lr=x", "--out", tiny_file.parent / "never"]), 1)
    assert err["type"] == "SpecError"
    problems = {p["path"]: p for p in err["problems"]}
    assert set(problems) == {"model.d_modle", "train.lr"}
    assert problems["model.d_modle"]["got"] == 8
    assert "did you mean 'd_model'" in problems["model.d_modle"]["fix"]
    assert "set by the override model.d_modle=8" in problems["model.d_modle"]["fix"]
    assert problems["train.lr"]["got"] == "x"
    assert not (tiny_file.parent / "never").exists()


def test_a_toml_syntax_error_has_its_line(tmp_path):
    bad = tmp_path / "bad.toml"
    bad.write_text('name = "x"\n[model\n')
    err = json_error(invoke(["spec", "show", bad, "--format", "json"]), 1)
    assert err["type"] == "SpecFileError"
    assert err["problems"][0]["line"] == 2 and "invalid TOML" in err["problems"][0]["message"]


@pytest.mark.parametrize("args, kind, code", [
    (["components", "show", "nope:nope"], "AtlasError", 1),
    (["components", "list", "strategie"], "BadParameter", 2),
    (["build", "/no/such.toml"], "SpecFileError", 1),
    (["spec", "show", "/no/such.toml"], "SpecFileError", 1),
    (["eval", "/no/such/run"], "CheckpointError", 1),
    (["generate", "/no/such/run", "--prompt-ids", "1"], "CheckpointError", 1),
    (["compare", "/no/such.toml"], "SpecFileError", 1),
    (["check", "nosuchnamespace"], "TargetError", 1),
    (["bench", "--lengths", "abc"], "BadParameter", 2),
    (["train", "a.toml", "b.toml"], "BadParameter", 2),
])
def test_known_errors_of_each_command(args, kind, code):
    err = json_error(invoke(["--format", "json", *args]), code)
    assert err["type"] == kind
    human = invoke(args)  # without JSON: nothing on stdout, the message on stderr
    assert human.exit_code == code and human.stdout == ""
    assert "Traceback" not in human.output


def test_human_mode_is_one_line_on_stderr():
    r = invoke(["build", "/no/such.toml"])
    assert r.exit_code == 1 and r.stdout == ""
    assert r.stderr.strip().splitlines() == ["error: /no/such.toml: no such file; check the path"]


def test_a_bug_is_a_json_error_with_the_traceback_on_stderr(monkeypatch, tiny_file):
    import atlas_cli.build as build

    def broken(*a, **k):
        raise RuntimeError("boom")

    monkeypatch.setattr(build, "build_report", broken)
    r = invoke(["--format", "json", "build", tiny_file])
    err = json_error(r, 1)
    assert err["type"] == "InternalError" and "RuntimeError: boom" in err["message"]
    assert "Traceback" in r.stderr
    # ATLAS_DEBUG=1: the exception itself, as in human mode
    monkeypatch.setenv("ATLAS_DEBUG", "1")
    r = invoke(["--format", "json", "build", tiny_file])
    assert isinstance(r.exception, RuntimeError) and r.stdout == ""


def test_an_interrupted_run_is_a_json_error_with_exit_130(monkeypatch, tiny_file):
    import atlas_core.api as api
    from atlas_core.train.errors import TrainingInterrupted

    def interrupted(*a, **k):
        raise TrainingInterrupted(3, "/runs/x/checkpoints/step-000000003")

    monkeypatch.setattr(api, "train", interrupted)
    err = json_error(invoke(["--format", "json", "train", tiny_file]), 130)
    assert err["type"] == "TrainingInterrupted" and "--resume" in err["message"]
    r = invoke(["train", tiny_file])
    assert r.exit_code == 130 and r.stdout == "" and "interrupted at step 3" in r.stderr


def test_validation_failures_keep_their_report(tiny_file):
    """`spec validate` reports every file (its data), not an error object, and exits 1."""
    r = invoke(["--format", "json", "spec", "validate", tiny_file, "model.depth=0"])
    assert r.exit_code == 1
    (row,) = json.loads(r.stdout)
    assert row["ok"] is False and row["errors"][0]["path"] == "model.depth"


def test_a_plugin_command_may_exit_and_raise_usage_errors():
    """typer's Exit and BadParameter from a plugin's command pass through the plugin guard (they
    are not plugin bugs); an unexpected exception becomes one PluginError naming the plugin."""
    from atlas_cli.main import _plugin_guard
    from atlas_core.errors import PluginError

    def exits():
        raise typer.Exit(3)

    def bad_value():
        raise typer.BadParameter("--n must be even")

    def broken():
        raise KeyError("x")

    with pytest.raises(typer.Exit):
        _plugin_guard(exits, "demo", "plugin 'demo'")()
    with pytest.raises(typer.BadParameter):
        _plugin_guard(bad_value, "demo", "plugin 'demo'")()
    with pytest.raises(PluginError, match="plugin 'demo'"):
        _plugin_guard(broken, "demo", "plugin 'demo'")()
