"""Prints the Python and the installed versions of the packages this project depends on, one line
each (``version: NAME X.Y``), so a CI log says what a run resolved to. Never fails: a missing
package reads "-", and any other problem is one line and exit status 0.

    python scripts/print_versions.py
"""

from __future__ import annotations

import platform
import sys

# the runtime dependencies first, then the extras' (hf, data, tensorboard, triton, test)
PACKAGES = (
    "atlas-ttm", "atlas-miras", "torch", "numpy", "pydantic", "typer", "click", "rich", "pluggy",
    "einops", "safetensors", "tomli-w", "transformers", "huggingface-hub", "tokenizers",
    "datasets", "tensorboard", "triton", "fla-core", "matplotlib", "pytest",
)


def version_of(name: str) -> str:
    try:
        from importlib.metadata import version

        return version(name)
    except Exception:  # not installed, or broken metadata: this script only reports
        return "-"


def main() -> int:
    try:
        lines = [f"python {platform.python_version()} ({sys.executable})"]
        lines += [f"{name} {version_of(name)}" for name in PACKAGES]
        print("\n".join(f"version: {line}" for line in lines), flush=True)
    except Exception as exc:  # noqa: BLE001 - a report must never stop CI
        try:
            print(f"version: could not be read ({type(exc).__name__}: {exc})", flush=True)
        except Exception:  # noqa: BLE001 - stdout itself is gone (a closed pipe)
            pass
    return 0


if __name__ == "__main__":
    sys.exit(main())
