#!/usr/bin/env bash
# The oldest versions this project declares: a new virtual environment under a temporary folder
# with every runtime dependency and those of the extras in EXTRAS (default "hf data tensorboard")
# pinned to the lower bound pyproject.toml gives it (scripts/oldest_pins.py), torch as the CPU
# build 2.13.0 (a bare torch requirement would pull a multi-GB CUDA build), the working tree
# installed into it, then pytest on TESTS (default: tests/hf, Hugging Face generation on the
# oldest transformers, and the corpus, tokenizer and TensorBoard tests of the other extras).
#
#   bash scripts/test_oldest.sh                  # the defaults
#   EXTRAS=hf TESTS=tests/hf bash scripts/test_oldest.sh -x
#
# Extra arguments go to pytest. PYTHON picks the interpreter the venv is made from.
set -euo pipefail
cd "$(dirname "$0")/.."
REPO=$(pwd)
BASE_PY=${PYTHON:-python3}
EXTRAS=${EXTRAS:-hf data tensorboard}
TESTS=${TESTS:-tests/hf tests/train/test_text_corpus.py tests/train/test_tensorboard.py}
WORK=$(mktemp -d "${TMPDIR:-/tmp}/atlas-oldest.XXXXXX")
trap 'rm -rf "$WORK"' EXIT
# a copy of the working tree (tracked and new files, not ignored ones): the install writes
# build metadata next to the sources, and the checkout may be in use
mkdir "$WORK/src"
git ls-files -z --cached --others --exclude-standard \
    | tar --null --ignore-failed-read -T - -cf - 2>/dev/null | tar -xf - -C "$WORK/src"
extra_args=()
for e in $EXTRAS; do extra_args+=(--extra "$e"); done
"$BASE_PY" scripts/oldest_pins.py "${extra_args[@]}" > "$WORK/oldest.txt"
echo "oldest: pins $(tr '\n' ' ' < "$WORK/oldest.txt")" >&2
"$BASE_PY" -m venv "$WORK/venv"
VPY="$WORK/venv/bin/python"
"$VPY" -m pip install -q "torch==2.13.0"
extras=$(echo "$EXTRAS" | tr ' ' ',')
"$VPY" -m pip install -q -c "$WORK/oldest.txt" -e "$WORK/src[$extras]" "pytest>=8,<10"
cd "$WORK/src"
"$VPY" scripts/print_versions.py
# shellcheck disable=SC2086  # TESTS is a list of paths
OMP_NUM_THREADS=${OMP_NUM_THREADS:-1} "$VPY" -m pytest -q -p no:cacheprovider $TESTS "$@"
