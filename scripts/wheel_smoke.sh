#!/usr/bin/env bash
# Builds the wheels (atlas-ttm and atlas-miras), installs them in a fresh virtual environment
# outside the repository and trains 20 steps of the embedded default from another directory:
# the installed package must carry its bundled plugins and data on its own.
set -euo pipefail
cd "$(dirname "$0")/.."
REPO=$(pwd)
BASE_PY=${PYTHON:-python3}
WORK=$(mktemp -d "${TMPDIR:-/tmp}/atlas-wheel.XXXXXX")
trap 'rm -rf "$WORK"' EXIT
echo "wheel: building into $WORK/dist" >&2
"$BASE_PY" -m pip wheel -q --no-deps -w "$WORK/dist" "$REPO" "$REPO/packages/atlas-miras"
"$BASE_PY" -m venv "$WORK/venv"
VPY="$WORK/venv/bin/python"
"$VPY" -m pip install -q "torch==2.13.0"
"$VPY" -m pip install -q "$WORK"/dist/atlas_ttm-*.whl "$WORK"/dist/atlas_miras-*.whl
cd "$WORK"  # not the repository: nothing may be imported from the source tree
"$VPY" - <<'PY'
import atlas_core, atlas_plugins, atlas_miras
for mod in (atlas_core, atlas_plugins, atlas_miras):
    assert "site-packages" in mod.__file__, f"{mod.__name__} imported from {mod.__file__}"
print("wheel: imports from", atlas_core.__file__)
PY
"$WORK/venv/bin/atlas" plugins list
"$WORK/venv/bin/atlas" train --steps 20 --out "$WORK/run" --no-progress
"$WORK/venv/bin/atlas" examples copy "$WORK/examples" --name titans_lmm --name zoo_gla
"$WORK/venv/bin/atlas" spec validate "$WORK/examples/titans_lmm.toml"
# an example that reads a file: its corpus ships with it (run from the folder holding examples/)
"$WORK/venv/bin/atlas" examples copy "$WORK/examples" --name text_char
"$WORK/venv/bin/atlas" train "$WORK/examples/text_char.toml" --steps 2 --out "$WORK/text-run" --no-progress
test -f "$WORK/run/spec.toml"
echo "wheel: OK (built, installed in a fresh venv, trained 20 steps from $WORK)" >&2
