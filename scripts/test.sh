#!/usr/bin/env bash
# Set-up plus the whole test suite (Triton kernels run in the CPU interpreter).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
PY=${PYTHON:-python3}
exec "$PY" -m pytest -q "$@"
