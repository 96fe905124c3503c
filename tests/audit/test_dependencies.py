"""The dependency contract: every dependency of both distributions has a lower bound (which
scripts/test_oldest.sh installs), the packages whose next major release is known or likely to
break us have an upper bound, and the version report CI prints never fails."""

from __future__ import annotations

import re
import subprocess
import sys
import tomllib
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "scripts"))
from oldest_pins import lower_bound  # noqa: E402

CAPPED = ("transformers", "datasets", "tokenizers", "tensorboard", "triton", "fla-core", "torch",
          "pydantic", "typer", "numpy", "click")


def _requirements(pyproject: Path) -> list[str]:
    project = tomllib.loads(pyproject.read_text())["project"]
    out = list(project["dependencies"])
    for extra in project.get("optional-dependencies", {}).values():
        out += extra
    return out


def _specifiers(requirement: str) -> str:
    return re.match(r"^[A-Za-z0-9._-]+(\[[^\]]*\])?\s*([^;]*)", requirement).group(2)


def test_every_dependency_has_a_lower_bound():
    for pyproject in (REPO / "pyproject.toml", REPO / "packages/atlas-miras/pyproject.toml"):
        missing = [r for r in _requirements(pyproject) if lower_bound(r)[1] is None]
        assert not missing, f"{pyproject}: no lower bound on {missing}"


def test_the_packages_that_break_us_have_an_upper_bound():
    found = {}
    for req in _requirements(REPO / "pyproject.toml"):
        name = lower_bound(req)[0].lower()
        specs = _specifiers(req)
        found.setdefault(name, []).append("<" in specs or "==" in specs)
    for name in CAPPED:
        assert name in found and all(found[name]), f"{name}: no upper bound in every place it is declared"


def test_the_lower_bounds_are_what_the_oldest_job_installs():
    proc = subprocess.run([sys.executable, str(REPO / "scripts/oldest_pins.py"), "--extra", "hf"],
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    pins = dict(line.split("==") for line in proc.stdout.split())
    assert pins["transformers"] == "5.0" and "torch" in pins and "typer" in pins
    # torch's lower bound is the CPU build that set-up and the oldest job install
    setup = (REPO / "scripts/setup.sh").read_text()
    pinned = re.search(r'"torch==([\d.]+)"', setup).group(1)
    assert pinned.startswith(pins["torch"]), (pinned, pins["torch"])
    bad = subprocess.run([sys.executable, str(REPO / "scripts/oldest_pins.py"), "--extra", "nope"],
                         capture_output=True, text=True, timeout=60)
    assert bad.returncode != 0 and "no extra 'nope'" in bad.stderr + bad.stdout


def test_the_version_report_names_the_key_packages_and_succeeds():
    proc = subprocess.run([sys.executable, str(REPO / "scripts/print_versions.py")],
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    lines = proc.stdout.splitlines()
    assert lines[0].startswith("version: python 3.")
    names = {line.split()[1] for line in lines[1:]}
    assert {"atlas-ttm", "torch", "transformers", "tokenizers", "datasets", "tensorboard",
            "triton", "fla-core"} <= names
    assert "version: torch " + __import__("torch").__version__ in proc.stdout
