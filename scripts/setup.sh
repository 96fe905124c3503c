#!/usr/bin/env bash
# Installs the project and everything it needs on a fresh machine (CPU).
# A bare `torch` requirement would pull a multi-GB CUDA build: install the pinned CPU build
# first when torch is missing, then the project (its own requirement is a range).
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
if ! "$PY" -c "import torch" 2>/dev/null; then
    "$PY" -m pip install -q "torch==2.13.0"
fi
"$PY" -m pip install -q -e ".[test,plot,triton]"
if [ -d packages/atlas-miras ]; then
    "$PY" -m pip install -q --no-deps ./packages/atlas-miras
fi
