"""The example specs shipped with the package (``examples/*.toml`` of the repository).

A wheel carries them as the data package ``atlas_core.examples``; an editable install reads them
from the checkout's ``examples/`` folder. `examples_dir` finds them either way; ``atlas examples``
lists them and copies them out for editing.
"""

from __future__ import annotations

from pathlib import Path


def examples_dir() -> Path:
    """The folder holding the example ``.toml`` specs."""
    import importlib

    try:  # a wheel: the data package atlas_core.examples (a namespace package: no __init__)
        for folder in importlib.import_module("atlas_core.examples").__path__:
            if any(Path(folder).glob("*.toml")):
                return Path(folder)
    except ModuleNotFoundError:  # an editable install maps only the top-level packages
        pass
    checkout = Path(__file__).resolve().parent.parent / "examples"
    if checkout.is_dir():
        return checkout
    raise FileNotFoundError("the example specs are not installed with this copy of atlas-ttm; "
                            "reinstall it (pip install atlas-ttm) or use a checkout's examples/")


def _paragraphs(comments: list[str]) -> list[list[str]]:
    """The header's comment lines (``#`` removed) split at blank comment lines."""
    out: list[list[str]] = [[]]
    for line in comments:
        if line.strip():
            out[-1].append(line.strip())
        elif out[-1]:
            out.append([])
    return [p for p in out if p]


def list_examples() -> list[dict[str, str]]:
    """``[{"name", "file", "summary", "cost"}]`` for every example, by name: the summary is the
    first paragraph of the file's header comment, whole; the cost is the paragraph that starts
    with ``Cost:`` (the FLOPs, the parameters and the measured speed), without its note on how it
    was measured."""
    out = []
    for path in sorted(examples_dir().glob("*.toml")):
        lines = path.read_text(encoding="utf-8").splitlines()
        header = []
        for line in lines:  # the comment block at the top of the file
            if not line.startswith("#"):
                break
            header.append(line[1:])
        paragraphs = _paragraphs(header)
        summary = " ".join(paragraphs[0]) if paragraphs else ""
        cost_lines = next((p for p in paragraphs if p[0].startswith("Cost:")), [])
        cost = " ".join(c for c in cost_lines if not c.startswith("(measured"))
        out.append({"name": path.stem, "file": str(path), "summary": summary,
                    "cost": cost.removeprefix("Cost:").strip()})
    return out
