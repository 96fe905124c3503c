"""Prints a pip constraints file that pins every dependency of pyproject.toml to its lowest
declared version (``name>=X`` -> ``name==X``): the runtime dependencies, plus those of the extras
named with ``--extra`` (repeatable). `scripts/test_oldest.sh` installs with it.

    python scripts/oldest_pins.py --extra hf > oldest.txt
"""

from __future__ import annotations

import argparse
import re
import sys
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
# name[extras] then the specifiers, up to an environment marker
REQUIREMENT = re.compile(r"^\s*([A-Za-z0-9][A-Za-z0-9._-]*)\s*(?:\[[^\]]*\])?\s*([^;]*)")


def lower_bound(requirement: str) -> tuple[str, str | None]:
    """``"torch>=2.13,<3"`` -> ``("torch", "2.13")``; ``("name", None)`` without a lower bound."""
    match = REQUIREMENT.match(requirement)
    if match is None:
        raise ValueError(f"cannot read the requirement {requirement!r}")
    name, specs = match.group(1), match.group(2)
    for spec in specs.split(","):
        spec = spec.strip()
        if spec.startswith(">="):
            return name, spec[2:].strip()
        if spec.startswith("=="):
            return name, spec[2:].strip()
    return name, None


def requirements(pyproject: Path, extras: list[str]) -> list[str]:
    project = tomllib.loads(pyproject.read_text())["project"]
    optional = project.get("optional-dependencies", {})
    unknown = [e for e in extras if e not in optional]
    if unknown:
        raise SystemExit(f"error: no extra {unknown[0]!r} in {pyproject}; extras: "
                         f"{', '.join(sorted(optional))}")
    out = list(project.get("dependencies", []))
    for extra in extras:
        out += optional[extra]
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--extra", action="append", default=[], help="an extra of pyproject.toml")
    ap.add_argument("--pyproject", type=Path, default=ROOT / "pyproject.toml")
    args = ap.parse_args(argv)
    pins: dict[str, str] = {}
    for req in requirements(args.pyproject, args.extra):
        name, low = lower_bound(req)
        if low is None:
            raise SystemExit(f"error: {req!r} in {args.pyproject} has no lower bound")
        pins[name.lower()] = low
    print("\n".join(f"{name}=={low}" for name, low in sorted(pins.items())))
    return 0


if __name__ == "__main__":
    sys.exit(main())
