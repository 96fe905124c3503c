# Sourced by setup.sh and test.sh: chooses the Python the project is installed into and sets PY.
#
# - Inside an active virtual environment or conda env (or PYTHON pointing at one): that Python.
# - Otherwise: the repository's own .venv, created from PYTHON (default python3) when missing.
#   A distribution's Python (Debian/Ubuntu, marked EXTERNALLY-MANAGED) refuses `pip install`,
#   and a venv needs neither sudo nor --break-system-packages.
# - ATLAS_NO_VENV=1 installs into PYTHON itself (for a Python you manage, e.g. pyenv).
#
# .venv/bin goes first on PATH when it is used, so `atlas` and `python` resolve to it.
BASE_PY=${PYTHON:-python3}
if ! command -v "$BASE_PY" >/dev/null 2>&1; then
    echo "error: no Python found (PYTHON=$BASE_PY); install Python 3.11+ or set PYTHON" >&2
    exit 1
fi
_in_env() {
    "$1" -c 'import os, sys; sys.exit(0 if sys.prefix != sys.base_prefix or os.path.isdir(os.path.join(sys.prefix, "conda-meta")) else 1)'
}
if [ "${ATLAS_NO_VENV:-0}" = "1" ] || _in_env "$BASE_PY"; then
    PY=$BASE_PY
    ATLAS_VENV=""
else
    ATLAS_VENV="$(pwd)/.venv"
    if [ ! -x "$ATLAS_VENV/bin/python" ]; then
        echo "setup: creating $ATLAS_VENV (no active virtual environment or conda env)" >&2
        "$BASE_PY" -m venv "$ATLAS_VENV"
    fi
    PY="$ATLAS_VENV/bin/python"
    export PATH="$ATLAS_VENV/bin:$PATH"
fi
