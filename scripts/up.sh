#!/usr/bin/env bash
# Set everything up and run on embedded defaults (SQLite, filesystem:// broker,
# the local Docker engine): virtualenv, package, Docker engine if installed but
# stopped, the agent image (built offline on first start), then
# `orchestrator up` in the foreground.  Ctrl-C stops everything.
set -euo pipefail
cd "$(dirname "$0")/.."
py="${PYTHON:-python3}"
[ -x .venv/bin/python ] || "$py" -m venv .venv
.venv/bin/python -m pip install -q --disable-pip-version-check -e .
bash scripts/services.sh
exec .venv/bin/orchestrator up "$@"
