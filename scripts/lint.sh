#!/usr/bin/env bash
# The checks that need no service: ruff (rules and format), mypy (strict) and the
# import contracts (lint-imports).  Seconds on a warm cache; .ci/run runs it
# before it installs or builds anything, so a type error fails CI at once.
set -euo pipefail
cd "$(dirname "$0")/.."
py="${PYTHON:-python3}"
[ -x .venv/bin/python ] || "$py" -m venv .venv
.venv/bin/python -m pip install -q --disable-pip-version-check -e '.[test]'
bin=.venv/bin
status=0
run() {
  local started=$SECONDS
  if "$@"; then
    echo "lint: $1 ok ($((SECONDS - started))s)"
  else
    echo "lint: $* FAILED"
    status=1
  fi
}
run "$bin/ruff" check --no-cache .
run "$bin/ruff" format --check --no-cache .
run "$bin/python" -m mypy
run "$bin/lint-imports" --no-cache
exit $status
