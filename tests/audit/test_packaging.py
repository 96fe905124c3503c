"""Packaging: one wheel of the repository root holds the core, every bundled plugin and the `atlas`
command, under namespaced import names only; the bundled plugins register through the entry-point
group exactly as a third-party package would (the core keeps no list of them)."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
PLUGIN_FOLDERS = sorted(p.name for p in (REPO / "plugins").iterdir() if (p / "plugin.py").exists())


@pytest.fixture(scope="module")
def wheel(tmp_path_factory):
    """A wheel built from a copy of the sources (nothing is written into the working tree)."""
    src = tmp_path_factory.mktemp("src")
    ignore = shutil.ignore_patterns("__pycache__", "*.egg-info", "build")
    for name in ("pyproject.toml", "setup.py", "README.md"):
        shutil.copy(REPO / name, src / name)
    for name in ("atlas_core", "plugins", "cli", "examples"):
        shutil.copytree(REPO / name, src / name, ignore=ignore)
    out = tmp_path_factory.mktemp("wheel")
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    proc = subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "--no-index",
         "--quiet", "-w", str(out), str(src)],
        capture_output=True, text=True, timeout=300, env=env)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    (path,) = out.glob("atlas_ttm-*.whl")
    return zipfile.ZipFile(path)


def _dist_info(wheel, name):
    (info,) = {n.split("/")[0] for n in wheel.namelist() if n.split("/")[0].endswith(".dist-info")}
    return wheel.read(f"{info}/{name}").decode()


def test_only_namespaced_top_level_packages(wheel):
    tops = {n.split("/")[0] for n in wheel.namelist()}
    tops = {t for t in tops if not t.endswith(".dist-info")}
    assert tops == {"atlas_core", "atlas_plugins", "atlas_cli"}  # no top-level `cli` or `plugins`
    names = set(wheel.namelist())
    for folder in PLUGIN_FOLDERS:
        assert f"atlas_plugins/{folder}/plugin.py" in names, folder
    assert "atlas_cli/main.py" in names and "atlas_core/rule.py" in names
    # the example specs travel as atlas_core.examples (`atlas examples`)
    shipped = {n.rsplit("/", 1)[1] for n in names if n.startswith("atlas_core/examples/")}
    assert shipped == {p.name for p in (REPO / "examples").iterdir()
                       if p.suffix in (".toml", ".txt")}
    # the text_char example's corpus travels as a file (the checkout's is a link to docs/math.md)
    corpus = wheel.read("atlas_core/examples/text_char.txt").decode()
    assert corpus == (REPO / "docs" / "math.md").read_text()


def test_entry_points_name_every_bundled_plugin_and_the_command(wheel):
    text = _dist_info(wheel, "entry_points.txt")
    section = text.split("[atlas_core.plugins]")[1].split("[")[0]
    eps = dict(re.findall(r"^(\w+) = ([\w.]+)$", section, flags=re.M))
    assert eps.pop("core") == "atlas_core.components.plugin"
    modules = {v.split(".")[1] for v in eps.values()}
    assert modules == set(PLUGIN_FOLDERS)  # every plugin folder, through the same door
    assert all(v.startswith("atlas_plugins.") and v.endswith(".plugin") for v in eps.values())
    assert re.search(r"^atlas = atlas_cli\.main:run$", text.split("[console_scripts]")[1], flags=re.M)


def test_runtime_dependencies_and_python(wheel):
    meta = _dist_info(wheel, "METADATA")
    assert "Requires-Python: >=3.11" in meta
    requires = {re.split(r"[<>=;\[ ]", line.split(": ", 1)[1])[0]: line
                for line in meta.splitlines() if line.startswith("Requires-Dist:") and "extra ==" not in line}
    assert {"torch", "pluggy", "typer", "rich", "pydantic", "einops"} <= set(requires)
    assert "<" in requires["typer"] and ">=" in requires["typer"]  # a pinned, tested range
    assert ">=2" in requires["pydantic"]


def test_core_has_no_list_of_bundled_plugins():
    """atlas_core finds plugins through entry points only: it never imports atlas_plugins."""
    offenders = []
    for path in (REPO / "atlas_core").rglob("*.py"):
        for line in path.read_text().splitlines():
            if re.match(r"\s*(from|import)\s+atlas_plugins\b", line):
                offenders.append(f"{path.relative_to(REPO)}: {line.strip()}")
    assert not offenders, offenders


def test_no_generic_module_importable_outside_the_repo(tmp_path):
    code = ("import importlib.util as u, sys; "
            "print([m for m in ('cli', 'plugins') if u.find_spec(m) is not None], "
            "all(u.find_spec(m) for m in ('atlas_cli', 'atlas_plugins.titans', 'atlas_core')))")
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    proc = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, env=env, capture_output=True,
                          text=True, timeout=120)
    assert proc.stdout.strip() == "[] True", proc.stdout + proc.stderr
