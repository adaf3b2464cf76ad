#!/usr/bin/env bash
# The test suite on another Python (default 3.12): a virtual environment, the README's install into
# it (scripts/install.sh; torch from the package index when the environment has none), then the
# not-slow tests on that interpreter.
#   scripts/test_python.sh [PYTHON]            default: python3.12 on PATH, else pyenv's 3.12
#   VENV=DIR scripts/test_python.sh ...        where the environment goes (default .venv-<version>)
#   scripts/test_python.sh python3.12 -m slow  extra arguments go to pytest (instead of -m "not slow")
set -euo pipefail
cd "$(dirname "$0")/.."
NAME=${1:-python3.12}
BASE=${1:-$(command -v python3.12 || ls -d "${PYENV_ROOT:-$HOME/.pyenv}"/versions/3.12*/bin/python 2>/dev/null | tail -n 1)}
shift || true
if [ -z "$BASE" ] || ! "$BASE" -c 'import sys' 2>/dev/null; then
    echo "test_python.sh: error: no such interpreter: $NAME (give a path to a Python 3.11 or 3.12)" >&2
    exit 2
fi
VERSION=$("$BASE" -c 'import sys; print("%d.%d" % sys.version_info[:2])')
VENV=${VENV:-.venv-$VERSION}
[ -x "$VENV/bin/python" ] || "$BASE" -m venv "$VENV"
PYTHON="$VENV/bin/python" bash scripts/install.sh
if [ $# -eq 0 ]; then set -- -m "not slow"; fi
exec "$VENV/bin/python" -m pytest tests -q -p no:cacheprovider "$@"
