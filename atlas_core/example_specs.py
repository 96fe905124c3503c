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


def list_examples() -> list[dict[str, str]]:
    """``[{"name", "file", "summary", "cost"}]`` for every example, by name: the summary is the
    first comment line of the file, the cost its ``# Cost:`` line when it has one."""
    out = []
    for path in sorted(examples_dir().glob("*.toml")):
        lines = path.read_text(encoding="utf-8").splitlines()
        comments = [ln[1:].strip() for ln in lines if ln.startswith("#")]
        cost = next((c.removeprefix("Cost:").strip() for c in comments if c.startswith("Cost:")), "")
        out.append({"name": path.stem, "file": str(path), "summary": comments[0] if comments else "",
                    "cost": cost})
    return out
