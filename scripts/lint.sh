#!/usr/bin/env bash
# The checks that need no service: ruff (rules and format), mypy (strict) and the
# import contracts (lint-imports).  .ci/run runs it before it installs or builds
# anything, so a type error fails CI in seconds.
#
# The tools run from a virtualenv of their own, kept per pyproject.toml (a hash of it)
# under ~/.cache/orchestrator, so a fresh clone does not install anything to lint;
# the code is read from this checkout (PYTHONPATH), never from an installed copy.
set -euo pipefail
cd "$(dirname "$0")/.."
py="${PYTHON:-python3}"
key=$(sha256sum pyproject.toml | cut -c1-16)
venv="${ORCHESTRATOR_LINT_VENV:-${XDG_CACHE_HOME:-$HOME/.cache}/orchestrator/lint-$key}"
if [ ! -e "$venv/.complete" ]; then
  echo "lint: making $venv (once per pyproject.toml)"
  rm -rf "$venv"
  "$py" -m venv "$venv"
  # The dependencies and the tools; the project itself is read from the checkout.
  "$venv/bin/python" -m pip install -q --disable-pip-version-check '.[test]'
  "$venv/bin/python" -m pip uninstall -q -y agent-orchestrator
  touch "$venv/.complete"
fi
export PYTHONPATH="$PWD:$PWD/container"
bin="$venv/bin"
status=0
run() {
  local name=$1 started=$SECONDS
  shift
  if "$@"; then
    echo "lint: $name ok ($((SECONDS - started))s)"
  else
    echo "lint: $name FAILED"
    status=1
  fi
}
run "ruff check" "$bin/ruff" check --no-cache .
run "ruff format" "$bin/ruff" format --check --no-cache .
run mypy "$bin/python" -m mypy
run lint-imports "$bin/lint-imports" --no-cache
exit $status
