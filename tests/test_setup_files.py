"""The repository's own files that a new user meets first: what git ignores, what set-up says."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.parametrize("path", ["hf/text-char/model.safetensors", "runs/x/metrics.jsonl"])
def test_the_docs_output_folders_are_ignored(path):
    """The README exports to hf/ and trains into runs/: neither shows up in `git status`."""
    r = subprocess.run(["git", "check-ignore", "-q", path], cwd=ROOT)
    assert r.returncode == 0, f"{path} is not ignored"


def test_setup_says_what_it_installs_before_each_install():
    """scripts/setup.sh runs pip quietly for minutes on a fresh machine: each install is
    announced on stderr first, so the wait is never silent."""
    lines = (ROOT / "scripts" / "setup.sh").read_text().splitlines()
    installs = [i for i, line in enumerate(lines) if re.search(r"-m pip install", line)]
    assert len(installs) >= 3
    for i in installs:
        before = " ".join(lines[max(0, i - 3):i])
        assert re.search(r'echo "setup: installing [^"]+', before) and ">&2" in before, lines[i]
