#!/usr/bin/env bash
# Set-up plus the whole test suite (Triton kernels run in the CPU interpreter), with the Python
# setup.sh installed into (./.venv unless a virtual environment or conda env is active).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
source scripts/python_env.sh
exec "$PY" -m pytest -q "$@"
