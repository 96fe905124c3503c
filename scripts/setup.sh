#!/usr/bin/env bash
# Installs the project and everything it needs on a fresh machine (CPU).
#
# Where: the active virtual environment or conda env; otherwise ./.venv, created here (works on a
# distribution's Python, PEP 668, with no sudo). See scripts/python_env.sh.
# A bare `torch` requirement would pull a multi-GB CUDA build: install the pinned CPU build
# first when torch is missing, then the project (its own requirement is a range).
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/python_env.sh
# pip is quiet (-q); each step says what it installs first, so a minute of silence is explained
if ! "$PY" -c "import torch" 2>/dev/null; then
    echo "setup: installing torch 2.13.0 (the CPU build, about 200 MB; a minute or two) ..." >&2
    "$PY" -m pip install -q "torch==2.13.0"
fi
echo "setup: installing atlas-ttm (editable) with its test, plot and triton extras (transformers," \
     "datasets, tokenizers, tensorboard, fla, triton, pytest; up to 2 minutes on a fresh venv) ..." >&2
"$PY" -m pip install -q -e ".[test,plot,triton]"
if [ -d packages/atlas-miras ]; then
    echo "setup: installing the atlas-miras plugin (editable) ..." >&2
    "$PY" -m pip install -q --no-deps -e ./packages/atlas-miras
fi
if [ -n "$ATLAS_VENV" ]; then
    echo "setup: installed into $ATLAS_VENV; the command is $ATLAS_VENV/bin/atlas" >&2
    echo "setup: run 'source .venv/bin/activate' to put atlas (and this python) on PATH" >&2
else
    echo "setup: installed into $("$PY" -c 'import sys; print(sys.prefix)')" >&2
fi
