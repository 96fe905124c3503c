#!/usr/bin/env bash
# Set-up plus the whole test suite (Triton kernels run in the CPU interpreter), with the Python
# setup.sh installed into (./.venv unless a virtual environment or conda env is active). The
# versions of the key packages are printed first (scripts/print_versions.py).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
source scripts/python_env.sh
"$PY" scripts/print_versions.py  # what this run resolved to, at the top of the log (never fails)
exec "$PY" -m pytest -q --durations=30 "$@"  # the slowest tests, at the end of the log
