"""The distribution is `atlas-ttm`: `atlas-memory` on the package index is an unrelated project, so
no file may tell anyone to install it (`pip install 'atlas-memory[hf]'` would replace this one)."""

from __future__ import annotations

import subprocess
import tomllib
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
NAME = "atlas-ttm"
OLD = "atlas-memory"


def _tracked_files() -> list[str]:
    if not (REPO / ".git").exists():
        pytest.skip("not a git checkout (the list of tracked files comes from git)")
    out = subprocess.run(["git", "ls-files", "-z"], cwd=REPO, capture_output=True, check=True)
    return [p for p in out.stdout.decode().split("\0") if p]


def test_the_distributions_are_named_atlas_ttm_and_atlas_miras():
    core = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    miras = tomllib.loads((REPO / "packages/atlas-miras/pyproject.toml").read_text())["project"]
    assert core["name"] == NAME and miras["name"] == "atlas-miras"
    assert any(dep.startswith(f"{NAME}>=") for dep in miras["dependencies"]), miras["dependencies"]
    # the import names and the command stay
    assert core["scripts"] == {"atlas": "atlas_cli.main:run"}


def test_no_tracked_file_names_the_unrelated_distribution():
    offenders = []
    for rel in _tracked_files():
        if rel == "tests/audit/test_distribution_name.py":
            continue
        path = REPO / rel
        if not path.is_file():
            continue
        try:
            text = path.read_text(encoding="utf-8")
        except UnicodeDecodeError:  # images
            continue
        for number, line in enumerate(text.splitlines(), 1):
            if OLD in line.lower() or "atlas_memory-" in line.lower():
                offenders.append(f"{rel}:{number}: {line.strip()}")
    assert not offenders, "\n".join(offenders)
