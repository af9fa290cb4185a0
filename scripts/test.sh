#!/usr/bin/env bash
# Run the whole test suite: make the virtualenv, start Docker, Redis and
# PostgreSQL if they are installed but stopped, then pytest in two processes
# (pytest-xdist: the integration tests in one, the rest beside them; see
# tests/conftest.py).  Extra arguments go to pytest (`-n 0`: one process).
set -euo pipefail
cd "$(dirname "$0")/.."
py="${PYTHON:-python3}"
[ -x .venv/bin/python ] || "$py" -m venv .venv
.venv/bin/python -m pip install -q --disable-pip-version-check -e '.[test]'
bash scripts/services.sh
exec .venv/bin/python -m pytest -n 2 --dist loadgroup "$@"
