#!/usr/bin/env bash
# What a fresh machine sees: clones this repository's committed HEAD into a temporary folder,
# then runs the README's commands there with a new virtual environment (.venv inside the clone,
# made from the base Python, not from any venv active here): set-up and the default training
# run (`bash scripts/setup.sh && .venv/bin/atlas train`), then CI (`.ci/run`: the test suite and
# the wheel smoke test). Run it before pushing; it needs the package index (a fresh install
# resolves the newest releases the declared ranges allow) and takes as long as CI.
#
#   bash scripts/check_fresh.sh                 # the whole of it
#   bash scripts/check_fresh.sh -x tests/spec   # pytest arguments: run only these tests
#   KEEP=1 bash scripts/check_fresh.sh          # keep the clone (its path is printed)
#
# Uncommitted changes are not in the clone: commit first.
set -euo pipefail
cd "$(dirname "$0")/.."
REPO=$(pwd)
# the interpreter a venv here was made from (a new venv must not nest in an active one)
BASE_PY=$("${PYTHON:-python3}" -c 'import sys; print(getattr(sys, "_base_executable", sys.executable))')
WORK=$(mktemp -d "${TMPDIR:-/tmp}/atlas-fresh.XXXXXX")
if [ "${KEEP:-0}" = "1" ]; then
    echo "fresh: keeping $WORK" >&2
else
    trap 'rm -rf "$WORK"' EXIT
fi
if [ -n "$(git status --porcelain --untracked-files=no)" ]; then
    echo "fresh: note: uncommitted changes are not checked (the clone is HEAD $(git rev-parse --short HEAD))" >&2
fi
git clone --quiet --no-local "$REPO" "$WORK/atlas"
cd "$WORK/atlas"
echo "fresh: $WORK/atlas at $(git rev-parse --short HEAD), Python $BASE_PY" >&2
# nothing from this shell's environment: no active venv or conda env, no PYTHONPATH
unset VIRTUAL_ENV CONDA_PREFIX PYTHONPATH ATLAS_NO_VENV
export PYTHON="$BASE_PY"
bash scripts/setup.sh
.venv/bin/atlas train --no-progress
if [ "$#" -gt 0 ]; then
    bash scripts/test.sh "$@"
else
    bash .ci/run
fi
echo "fresh: OK (a clone of HEAD in a new venv: set-up, atlas train, and the tests passed)" >&2
