"""The `atlas` command as a user runs it: a fresh process, with a broken third-party plugin installed.

The broken plugin is a fake distribution (``fake_plugin-0.1.dist-info`` with an entry point in
the group ``atlas_core.plugins``) whose module raises at import, put on PYTHONPATH.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

import pytest


@pytest.fixture(scope="module")
def env(tmp_path_factory):
    root = tmp_path_factory.mktemp("fake_site")
    info = root / "fake_plugin-0.1.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: fake-plugin\nVersion: 0.1\n")
    (info / "entry_points.txt").write_text("[atlas_core.plugins]\nfake = fake_plugin_mod\n")
    (root / "fake_plugin_mod.py").write_text('raise RuntimeError("fake plugin exploded")\n')
    bad = root / "bad.toml"
    bad.write_text('schema = "atlas/1"\n[model]\narch = "titans:lmm"\nvocab_szie = 3\n[memory]\nuse = "titans:titanz"\n')
    (root / "syntax.toml").write_text('schema = "atlas/1"\n[model\n')
    e = {k: v for k, v in os.environ.items() if not k.startswith("ATLAS_")}
    e["PYTHONPATH"] = os.pathsep.join([str(root), e.get("PYTHONPATH", "")]).rstrip(os.pathsep)
    return e, root


def atlas(args, env, extra_env=None):
    e = dict(env)
    e.update(extra_env or {})
    return subprocess.run([sys.executable, "-m", "atlas_cli", *args], env=e, capture_output=True,
                          text=True, timeout=120)


def test_plugins_list_shows_the_broken_plugin_without_importing_torch(env):
    e, _ = env
    code = textwrap.dedent("""
        import sys
        from atlas_cli.main import run
        try:
            run(["--format", "json", "plugins", "list"])
        except SystemExit as exc:
            code = exc.code
        heavy = sorted(m for m in sys.modules if m.split(".")[0] in ("torch", "triton"))
        print("EXIT", code, "HEAVY", heavy, file=sys.stderr)
    """)
    e = {**e, "ATLAS_DISABLE_PLUGINS": "titans"}
    proc = subprocess.run([sys.executable, "-c", code], env=e, capture_output=True, text=True, timeout=120)
    assert "EXIT 0 HEAVY []" in proc.stderr, proc.stderr
    rows = {r["namespace"]: r for r in json.loads(proc.stdout)}
    assert rows["fake"]["status"] == "failed"
    assert rows["fake"]["distribution"] == "fake-plugin" and rows["fake"]["version"] == "0.1"
    assert rows["fake"]["error"] == "RuntimeError: fake plugin exploded"
    assert rows["core"]["status"] == "ok"
    assert rows["titans"]["status"] == "disabled" and rows["titans"]["n_components"] == 0


def test_other_commands_still_work_with_a_broken_plugin(env):
    e, _ = env
    proc = atlas(["components", "list", "strategy", "--format", "json"], e)
    assert proc.returncode == 0, proc.stderr
    assert "core:sequential" in {r["name"] for r in json.loads(proc.stdout)}
    doctor = atlas(["plugins", "doctor"], e)
    assert doctor.returncode == 1 and "fake plugin exploded" in doctor.stdout


def test_bad_spec_exit_1_without_traceback_and_with_one_under_debug(env):
    e, root = env
    proc = atlas(["spec", "show", str(root / "bad.toml")], e)
    assert proc.returncode == 1
    assert proc.stderr.startswith("error: ") and "Traceback" not in proc.stderr
    assert "model.vocab_szie" in proc.stderr and "did you mean 'vocab_size'" in proc.stderr
    assert "memory.use" in proc.stderr and "did you mean 'titans:titans'" in proc.stderr
    # (a TOML syntax error fails before anything imports torch: a fast second run)
    syntax = atlas(["spec", "show", str(root / "syntax.toml")], e)
    assert syntax.returncode == 1 and "Traceback" not in syntax.stderr
    assert syntax.stderr.startswith(f"error: {root / 'syntax.toml'}:2:") and "invalid TOML" in syntax.stderr
    assert len(syntax.stderr.strip().splitlines()) == 1
    debug = atlas(["spec", "show", str(root / "syntax.toml")], e, {"ATLAS_DEBUG": "1"})
    assert debug.returncode == 1 and "Traceback" in debug.stderr and "SpecFileError" in debug.stderr
    usage = atlas(["spec", "shwo"], e)
    assert usage.returncode == 2


def test_every_command_still_works_with_a_broken_plugin(env):
    """The broken plugin is installed; one process runs each command the way `atlas` would."""
    e, _ = env
    example = os.path.join(os.path.dirname(__file__), "..", "..", "examples", "titans_lmm.toml")
    code = textwrap.dedent(f"""
        import sys
        from atlas_cli.main import run
        commands = [
            ["spec", "validate", {example!r}],
            ["spec", "show", {example!r}],
            ["build", {example!r}, "--device", "meta"],
            ["components", "show", "titans:mlp"],
            ["--format", "json", "env"],
        ]
        for args in commands:
            try:
                run(args)
                code = 0
            except SystemExit as exc:
                code = exc.code or 0
            print("EXIT", args[0] if args[0] != "--format" else args[2], code, file=sys.stderr)
    """)
    proc = subprocess.run([sys.executable, "-c", code], env=e, capture_output=True, text=True, timeout=300)
    exits = [line.split()[1:] for line in proc.stderr.splitlines() if line.startswith("EXIT ")]
    assert exits == [["spec", "0"], ["spec", "0"], ["build", "0"], ["components", "0"], ["env", "0"]], proc.stderr
    assert "Traceback" not in proc.stderr
    env_json = json.loads(proc.stdout[proc.stdout.rindex("\n{") + 1:])  # the last command's output
    fake = [p for p in env_json["plugins"] if p["namespace"] == "fake"]
    assert fake and fake[0]["status"] == "failed"
