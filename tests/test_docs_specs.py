"""Every TOML spec the docs show builds: each ``toml`` block of README.md and docs/*.md with a
``[model]`` table naming an ``arch`` is resolved and its parameters counted (the preflight
`atlas spec validate` runs), after the header a fragment leaves out (``schema``, ``name``) and,
where the block has no ``[memory]`` table, a default memory rule."""

from __future__ import annotations

import re
import tomllib
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def spec_blocks() -> list[tuple[str, int, str]]:
    out = []
    for doc in [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]:
        text = doc.read_text()
        for m in re.finditer(r"^```toml\n(.*?)^```", text, re.S | re.M):
            block = m.group(1)
            if re.search(r"^\[model\]", block, re.M) and re.search(r"^arch\s*=", block, re.M):
                out.append((doc.relative_to(ROOT).as_posix(), text[: m.start()].count("\n") + 1, block))
    return out


BLOCKS = spec_blocks()


def test_the_docs_show_specs():
    assert len(BLOCKS) >= 3  # the README's, architecture.md's and zoo.md's hybrids at least


@pytest.mark.parametrize("doc, line, block", BLOCKS, ids=[f"{d}:{n}" for d, n, _ in BLOCKS])
def test_doc_spec_builds(doc, line, block):
    from atlas_core.preflight import estimate_params
    from atlas_core.spec import load_spec

    data = tomllib.loads(block)
    data.setdefault("schema", "atlas/1")
    data.setdefault("name", "doc-spec")
    data.setdefault("memory", {"use": "zoo:gated_deltanet"})
    data.pop("train", None)  # the task's files are the reader's (docs/data.md's spec trains in the docs test)
    spec = load_spec(data)
    assert estimate_params(spec) > 0
