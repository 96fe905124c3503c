"""The `atlas` commands in this process (typer's CliRunner), on the installed plugins plus a toy one."""

from __future__ import annotations

import copy
import json
import tomllib
import types

import pytest
from typer.testing import CliRunner

from atlas_core.host.hookspecs import hookimpl
from atlas_core.host.manager import reset_host
from atlas_core.spec import dump_toml, load_spec
from atlas_cli.main import make_app
from tests.spec.toys import VALID, toy_host

runner = CliRunner()


@pytest.fixture(scope="module")
def host():
    h = toy_host()
    reset_host(h)
    yield h
    reset_host(None)


# the toy spec with an anchored rule: core:chunkwise at chunk_size = 4 runs a rule whose anchor
# it divides (the per-token toy:delta rule would be refused, see test_spec_validate)
TOY = copy.deepcopy(VALID)
TOY["memory"]["anchor"] = 4


@pytest.fixture
def toy_file(tmp_path):
    path = tmp_path / "toy.toml"
    path.write_text(dump_toml(TOY))
    return path


@pytest.fixture
def bad_file(tmp_path):
    data = copy.deepcopy(TOY)
    data["model"]["arch"] = "toy:lmm"
    data["memory"]["algorithm"] = "core:momentun"
    data["layer"]["conv_size"] = -3
    path = tmp_path / "bad.toml"
    path.write_text(dump_toml(data))
    return path


def invoke(args, **kw):
    return runner.invoke(make_app(), [str(a) for a in args], **kw)


def as_json(result):
    assert result.exit_code in (0, 1), result.output
    return json.loads(result.stdout)


def test_plugins_list(host):
    rows = as_json(invoke(["--format", "json", "plugins", "list"]))
    by_ns = {r["namespace"]: r for r in rows}
    assert by_ns["core"]["status"] == "ok" and by_ns["core"]["n_components"] >= 10
    assert by_ns["toy"]["status"] == "ok" and by_ns["toy"]["distribution"] == "<local>"
    assert by_ns["toy"]["n_components"] == 4
    human = invoke(["plugins", "list"])
    assert human.exit_code == 0 and "toy" in human.stdout and "core" in human.stdout


def test_plugins_doctor_ok_then_failing(host):
    result = invoke(["plugins", "doctor", "--format", "json"])
    data = as_json(result)
    assert result.exit_code == 0 and data["ok"] is True
    toy = next(p for p in data["plugins"] if p["namespace"] == "toy")
    assert toy["hooks"] == ["atlas_cli_apps", "atlas_register"]
    # the toy's "spec" sub-app collides with the built-in group: skipped, and said so
    assert [s["name"] for s in data["skipped_cli_apps"]] == ["spec"]

    broken = types.ModuleType("broken_plugin")

    @hookimpl
    def atlas_register(registry):
        raise RuntimeError("broken on purpose")

    broken.atlas_register = atlas_register
    host.add_plugin_module("broken", broken)
    try:
        result = invoke(["plugins", "doctor"])
        assert result.exit_code == 1
        assert "broken on purpose" in result.stdout and "Traceback" in result.stdout
        listing = as_json(invoke(["--format", "json", "plugins", "list"]))
        row = next(r for r in listing if r["namespace"] == "broken")
        assert row["status"] == "failed" and "RuntimeError: broken on purpose" in row["error"]
        assert invoke(["components", "list"]).exit_code == 0  # everything else still works
    finally:
        del host.records["broken"]


def test_components_list_kind_and_pattern(host):
    rows = as_json(invoke(["components", "list", "strategy", "--format", "json"]))
    names = {r["name"] for r in rows}
    assert {"core:sequential", "core:chunkwise", "toy:picky"} <= names
    assert {r["kind"] for r in rows} == {"strategy"}
    rows = as_json(invoke(["--format", "json", "components", "list", "strategy", "core:*"]))
    assert {r["name"] for r in rows} == {"core:sequential", "core:chunkwise", "core:exact_chunk"}
    rows = as_json(invoke(["--format", "json", "components", "list", "toy:*"]))  # a pattern alone
    assert {r["name"] for r in rows} == {"toy:lm", "toy:delta", "toy:solo", "toy:picky"}
    bad = invoke(["components", "list", "strategie"])
    assert bad.exit_code == 2 and "did you mean 'strategy'" in bad.output


def test_components_show(host):
    data = as_json(invoke(["--format", "json", "components", "show", "toy:lm"]))
    (lm,) = data
    assert lm["kind"] == "arch" and lm["provider"]["namespace"] == "toy"
    props = lm["params_schema"]["properties"]
    assert props["vocab_size"]["default"] == 32 and props["depth"]["maximum"] == 4
    preset = as_json(invoke(["--format", "json", "components", "show", "toy:delta"]))[0]
    assert preset["extra"]["knobs"] == {"bias": "core:l2", "algorithm": "core:gd"}
    human = invoke(["components", "show", "toy:lm"])
    assert human.exit_code == 0 and "vocab_size" in human.stdout and "toy language model" in human.stdout
    missing = invoke(["components", "show", "toy:lmm"])
    assert missing.exit_code == 1
    assert "did you mean 'toy:lm'" in missing.stderr and "Traceback" not in missing.output


def test_spec_validate(host, toy_file, bad_file):
    ok = invoke(["spec", "validate", toy_file])
    assert ok.exit_code == 0 and "ok" in ok.stdout
    bad = invoke(["--format", "json", "spec", "validate", toy_file, bad_file, toy_file.parent / "nope.toml"])
    assert bad.exit_code == 1
    rows = json.loads(bad.stdout)
    assert [r["ok"] for r in rows] == [True, False, False]
    assert rows[0]["spec_hash"] == load_spec(toy_file).spec_hash
    paths = {e["path"] for e in rows[1]["errors"]}
    assert paths == {"model.arch", "memory.algorithm", "layer.conv_size"}
    assert "no such file" in rows[2]["errors"][0]["message"]
    human = invoke(["spec", "validate", bad_file])
    assert human.exit_code == 1
    assert "did you mean 'core:momentum'" in human.stdout and "did you mean 'toy:lm'" in human.stdout
    assert "Traceback" not in human.output


def test_spec_validate_refuses_chunks_of_a_per_token_rule(host, tmp_path):
    """Chunks of 4 on the per-token rule (anchor = 1) would compute another function: refused at
    memory.parallel with a reason naming the anchor."""
    data = copy.deepcopy(TOY)
    del data["memory"]["anchor"]
    path = tmp_path / "per_token.toml"
    path.write_text(dump_toml(data))
    (row,) = as_json(invoke(["--format", "json", "spec", "validate", path]))
    assert row["ok"] is False
    assert [e["path"] for e in row["errors"]] == ["memory.parallel"]
    assert "anchor" in row["errors"][0]["message"] and "chunk_size=4" in row["errors"][0]["message"]


def test_spec_show_toml_and_json(host, toy_file):
    spec = load_spec(toy_file)
    text = invoke(["spec", "show", toy_file])
    assert text.exit_code == 0
    assert load_spec(text.stdout) == spec
    assert tomllib.loads(text.stdout)["memory"]["structure"] == {"use": "core:linear"}
    data = as_json(invoke(["spec", "show", toy_file, "--format", "json"]))
    about = data.pop("_resolved")
    assert data == spec.to_dict() and about["spec_hash"] == spec.spec_hash


def test_known_error_is_one_line_and_debug_shows_it(host, bad_file):
    result = invoke(["spec", "show", bad_file])
    assert result.exit_code == 1 and result.stdout == ""
    assert result.stderr.startswith("error: ") and "3 problems" in result.stderr
    assert result.exception is None or isinstance(result.exception, SystemExit)
    debug = invoke(["spec", "show", bad_file], env={"ATLAS_DEBUG": "1"})
    assert debug.exit_code == 1
    from atlas_core.errors import SpecError

    assert isinstance(debug.exception, SpecError)  # raised through: a traceback is shown


def test_usage_errors_exit_2(host):
    assert invoke(["nosuchcommand"]).exit_code == 2
    assert invoke(["spec", "validate"]).exit_code == 2  # FILE... missing
    assert invoke(["--format", "yaml", "plugins", "list"]).exit_code == 2
    assert invoke(["build", "x.toml", "--device", "gpu"]).exit_code == 2


@pytest.mark.parametrize("device", ["cpu", "meta"])
def test_build_reports_parameters_per_block(host, toy_file, device):
    result = invoke(["--format", "json", "build", toy_file, "--device", device])
    assert result.exit_code == 0, result.output
    data = json.loads(result.stdout)
    assert data["param_devices"] == [device]
    blocks = {b["block"]: b["params"] for b in data["blocks"]}
    d, vocab = TOY["model"]["d_model"], TOY["model"]["vocab_size"]
    assert blocks["embed"] == vocab * d and blocks["head"] == d * vocab  # counted by hand
    assert sum(blocks.values()) == data["total_params"]  # no tied weights in the toy
    assert data["total_bytes"] == 4 * data["total_params"]  # float32
    assert "building toy:lm" in result.stderr


def test_build_counts_agree_between_cpu_and_meta(host, toy_file):
    cpu = as_json(invoke(["--format", "json", "build", toy_file]))
    meta = as_json(invoke(["--format", "json", "build", toy_file, "--device", "meta"]))
    assert cpu["blocks"] == meta["blocks"] and cpu["total_params"] == meta["total_params"] > 0


def test_env(host):
    from importlib import metadata

    import torch

    data = as_json(invoke(["env", "--format", "json"]))
    assert data["torch"] == torch.__version__
    try:
        triton = metadata.version("triton")
    except metadata.PackageNotFoundError:
        triton = None
    assert data["triton"] == triton
    assert "core:chunkwise" in data["strategies"] and "toy:picky" in data["strategies"]
    for rows in data["strategies"].values():
        for row in rows:
            assert row["status"] in {"available", "unavailable", "uncertified", "unused", "disabled"}
    assert any(p["namespace"] == "toy" for p in data["plugins"])
    assert invoke(["env"]).exit_code == 0


def test_plugin_sub_app_is_mounted(host):
    result = invoke(["toycmd", "hello", "--name", "atlas"])
    assert result.exit_code == 0 and result.stdout.strip() == "hello atlas from toy"
    # the built-in `spec` group is not replaced by the toy's colliding sub-app
    assert "validate" in invoke(["spec", "--help"]).stdout


COMMANDS = [
    ["plugins", "list"], ["plugins", "doctor"], ["components", "list"], ["components", "show"],
    ["spec", "validate"], ["spec", "show"], ["build"], ["env"], ["check"], ["plugins", "new"],
    ["export-hf"], ["tokenizer", "train"], ["tokenizer", "export"], ["examples", "list"],
    ["examples", "copy"],
]


@pytest.mark.parametrize("cmd", COMMANDS, ids=["-".join(c) for c in COMMANDS])
def test_every_command_help_shows_an_example_and_format(host, cmd):
    result = invoke([*cmd, "--help"])
    assert result.exit_code == 0
    assert "Example" in result.stdout and "atlas " + cmd[0] in result.stdout
    assert "--format" in result.stdout
