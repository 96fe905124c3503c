#!/usr/bin/env bash
# The Hugging Face clients' job: tests/hf/test_clients.py (lm-evaluation-harness from its own
# command line on a char-level and a BPE export, checked against atlas eval; PEFT LoRA trained,
# saved, reloaded and merged on an export) with the `clients` extra (lm-eval, peft), which the
# main suite does not install: they are heavy (about 40 packages) and only these tests use them.
#
# The extra goes into a new virtual environment under a temporary folder layered over the one
# scripts/setup.sh installed into (a .pth file adds that environment's site-packages, with its
# own .pth files, after this one's): torch, transformers and the rest are not installed again,
# and the set-up environment is left as it was. Run scripts/setup.sh first (scripts/test.sh
# does; this script runs it when atlas_core, torch or transformers is missing there).
#
#   bash scripts/test_clients.sh            # extra arguments go to pytest
#
# Needs the package index (the extra's packages).
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/python_env.sh  # PY: the environment setup.sh installs into
if ! "$PY" -c "import atlas_core, torch, transformers" 2>/dev/null; then
    bash scripts/setup.sh
fi
WORK=$(mktemp -d "${TMPDIR:-/tmp}/atlas-clients.XXXXXX")
trap 'rm -rf "$WORK"' EXIT
BASE_SITE=$("$PY" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
BASE_EXE=$("$PY" -c 'import sys; print(getattr(sys, "_base_executable", sys.executable))')
"$BASE_EXE" -m venv "$WORK/venv"
VPY="$WORK/venv/bin/python"
VSITE=$("$VPY" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
echo "import site; site.addsitedir('$BASE_SITE')" > "$VSITE/zz-atlas-setup-env.pth"
echo "clients: installing the clients extra (lm-eval, peft and their dependencies) into" \
     "$WORK/venv, over $BASE_SITE ..." >&2
"$VPY" -m pip install -q -e ".[clients]"
# the tests skip without these: here they must run
"$VPY" -c "import lm_eval, peft, atlas_core; from importlib.metadata import version as v; \
print('clients: lm-eval', v('lm-eval'), 'peft', v('peft'), 'transformers', v('transformers'), \
'torch', v('torch'))"
OMP_NUM_THREADS=${OMP_NUM_THREADS:-1} "$VPY" -m pytest -q -p no:cacheprovider -rs \
    tests/hf/test_clients.py "$@"
