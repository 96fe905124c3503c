"""A plugin's failure is reported as the plugin's, in one line, never as a traceback.

A component whose factory (or params model) does not import, a factory that raises something
other than a refusal of its params (`AtlasError`, ValueError), and a plugin command that raises:
each is one `PluginError` that names the component or command and the plugin that provides it
(namespace, distribution, version, module), through the real commands. ``ATLAS_DEBUG=1`` keeps
the original traceback.
"""

from __future__ import annotations

import json
import types

import pytest
import typer
from typer.testing import CliRunner

from atlas_core.errors import PluginError, SpecError
from atlas_core.host import PluginHost, hookimpl
from atlas_core.host.manager import PluginRecord, reset_host
from atlas_core.host.registry import Params
from atlas_core.spec import dump_toml
from atlas_cli.main import make_app, run

ORIGIN = "of plugin 'acme' (acme-dist 1.2, acme_plugin_mod)"


class ArchParams(Params):
    vocab_size: int = 16
    d_model: int = 16
    depth: int = 1
    heads: int = 2


def _boom(params, ctx):
    raise RuntimeError("boom in the factory\nsecond line")


def _refuses(params, ctx):
    raise ValueError("scale must be positive")


def _plugin_module():
    mod = types.ModuleType("acme_plugin_mod")

    def register(registry):
        registry.add("bias", "gone", "acme_no_such_module:build")
        registry.add("bias", "bad_params", "atlas_core.components.l2:build",
                     params="acme_no_such_module:Params")
        registry.add("bias", "boom", _boom)
        registry.add("bias", "refuses", _refuses)
        registry.add("rule", "boom_rule", _boom)
        registry.add("arch", "boom_arch", _boom, params=ArchParams)

    acme = typer.Typer()

    @acme.command("hello")
    def hello() -> None:
        raise RuntimeError("plugin command exploded")

    @acme.command("picky")
    def picky() -> None:
        raise ValueError("--level must be 1 or 2")

    mod.atlas_register = hookimpl(register)
    mod.atlas_cli_apps = hookimpl(lambda: [("acme", acme)])
    return mod


@pytest.fixture(scope="module")
def host():
    h = PluginHost(strict=False).load_entry_points()
    h.add_plugin_module("acme", _plugin_module(),
                        PluginRecord("acme", "acme_plugin_mod", "acme-dist", "1.2"))
    reset_host(h)
    yield h
    reset_host(None)


def _spec(tmp_path, *, bias="core:l2", memory=None, arch="titans:lmm"):
    data = {
        "schema": "atlas/1", "name": "acme-test",
        "model": {"arch": arch, "vocab_size": 16, "d_model": 16, "depth": 1, "heads": 2},
        "memory": memory or {"structure": "core:linear", "bias": bias, "retention": "core:none",
                             "algorithm": "core:gd", "parallel": "core:sequential"},
    }
    path = tmp_path / "spec.toml"
    path.write_text(dump_toml(data))
    return path


# -- the registry -----------------------------------------------------------------------------------
def test_a_factory_that_does_not_import_names_its_plugin(host):
    with pytest.raises(PluginError) as info:
        host.registry.build("bias", "acme:gone", path="memory.bias")
    assert str(info.value) == (
        f"acme:gone (bias) {ORIGIN}: its factory 'acme_no_such_module:build', needed at "
        "memory.bias, does not import (ModuleNotFoundError: No module named 'acme_no_such_module'); reinstall or fix the "
        "plugin (`atlas check acme` tests it), or use another bias")
    assert isinstance(info.value.__cause__, ModuleNotFoundError)


def test_a_params_model_that_does_not_import_names_its_plugin(host):
    with pytest.raises(PluginError, match=r"acme:bad_params \(bias\) of plugin 'acme'.*its params "
                                          r"model 'acme_no_such_module:Params', needed at memory.bias, does not import"):
        host.registry.build("bias", {"use": "acme:bad_params", "x": 1}, path="memory.bias")


def test_a_factory_that_raises_names_its_plugin_and_where(host):
    with pytest.raises(PluginError) as info:
        host.registry.build("bias", "acme:boom", path="memory.bias")
    assert str(info.value) == (
        f"acme:boom (bias) {ORIGIN} failed while building memory.bias (RuntimeError: boom in the "
        "factory); this is a bug in the plugin: report it to its authors, or use another bias "
        "(ATLAS_DEBUG=1 shows the traceback)")
    assert isinstance(info.value.__cause__, RuntimeError)


def test_a_factory_refusing_its_params_is_left_alone(host):
    with pytest.raises(ValueError, match="^scale must be positive$"):
        host.registry.build("bias", "acme:refuses", path="memory.bias")


# -- through `atlas spec validate` and `atlas build` -------------------------------------------------
@pytest.mark.parametrize("case, expected", [
    ({"bias": "acme:gone"}, "acme:gone (bias) " + ORIGIN + ": its factory"),
    ({"bias": "acme:boom"}, "acme:boom (bias) " + ORIGIN + " failed while building memory.bias"),
    ({"memory": {"use": "acme:boom_rule", "parallel": "core:sequential"}},
     "acme:boom_rule (rule) " + ORIGIN + " failed while building memory"),
    ({"arch": "acme:boom_arch"}, "acme:boom_arch (arch) " + ORIGIN + " failed while building model"),
])
def test_spec_validate_reports_a_plugin_failure(host, tmp_path, case, expected):
    path = _spec(tmp_path, **case)
    r = CliRunner().invoke(make_app(), ["--format", "json", "spec", "validate", str(path)])
    assert r.exit_code == 1, r.output
    (row,) = json.loads(r.stdout)
    (error,) = row["errors"]
    assert expected in error["text"] and "Traceback" not in r.output


def test_build_reports_a_plugin_failure_in_one_line(host, tmp_path):
    r = CliRunner().invoke(make_app(), ["build", str(_spec(tmp_path, bias="acme:boom"))])
    assert r.exit_code == 1 and "Traceback" not in r.output
    (line,) = r.stderr.strip().splitlines()
    assert line.startswith("error: ") and f"acme:boom (bias) {ORIGIN} failed" in line


def test_debug_shows_the_original_exception(host, monkeypatch):
    monkeypatch.setenv("ATLAS_DEBUG", "1")
    with pytest.raises(PluginError) as info:
        host.registry.build("bias", "acme:boom", path="memory.bias")
    assert isinstance(info.value.__cause__, RuntimeError)  # chained: the traceback shows both


# -- plugin commands --------------------------------------------------------------------------------
def _run(argv, capsys):
    with pytest.raises(SystemExit) as info:
        run(argv)
    out = capsys.readouterr()
    return info.value.code, out.out, out.err


def test_a_plugin_command_that_raises_is_one_line_naming_the_plugin(host, capsys, monkeypatch):
    monkeypatch.delenv("ATLAS_DEBUG", raising=False)
    code, out, err = _run(["acme", "hello"], capsys)
    assert code == 1 and out == ""
    assert err.splitlines() == [
        f"error: `atlas acme hello` {ORIGIN} failed (RuntimeError: plugin command exploded); "
        "this is a bug in the plugin: report it to its authors (`atlas plugins doctor` names "
        "them), ATLAS_DEBUG=1 shows the traceback"]


def test_a_plugin_command_refusing_its_input_keeps_its_message(host, capsys, monkeypatch):
    monkeypatch.delenv("ATLAS_DEBUG", raising=False)
    code, _, err = _run(["acme", "picky"], capsys)
    assert code == 1 and err.splitlines() == ["error: --level must be 1 or 2"]


def test_a_plugin_command_under_debug_raises_the_original(host, monkeypatch):
    monkeypatch.setenv("ATLAS_DEBUG", "1")
    with pytest.raises(RuntimeError, match="plugin command exploded"):
        run(["acme", "hello"])


def test_mounting_twice_wraps_once(host, capsys, monkeypatch):
    monkeypatch.delenv("ATLAS_DEBUG", raising=False)
    make_app()
    make_app()
    _, _, err = _run(["acme", "hello"], capsys)
    assert err.count("of plugin 'acme'") == 1


def test_a_spec_error_is_still_a_spec_error(host):
    with pytest.raises(SpecError):
        host.registry.build("bias", "acme:nope", path="memory.bias")
