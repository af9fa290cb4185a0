#!/usr/bin/env bash
# Run the whole test suite: make the virtualenv, start Docker, Redis and
# PostgreSQL if they are installed but stopped, then pytest.  Extra arguments
# go to pytest.
#
# With no test paths among the arguments, two pytest processes run at once:
# tests/integration (workers, containers and timings, one test at a time) and,
# beside it, tests/host and tests/container, which start no container and use
# Redis databases of their own (0 with a key prefix, 12; the integration tests
# use 13 and 15).  The integration process sets the pace; the other's report
# is printed after it.  Given paths, one pytest runs them.
set -euo pipefail
cd "$(dirname "$0")/.."
py="${PYTHON:-python3}"
[ -x .venv/bin/python ] || "$py" -m venv .venv
.venv/bin/python -m pip install -q --disable-pip-version-check -e '.[test]'
bash scripts/services.sh
for arg in "$@"; do
  if [ -e "${arg%%::*}" ]; then
    exec .venv/bin/python -m pytest "$@"
  fi
done
beside="$(mktemp)"
trap 'rm -f "$beside"' EXIT
.venv/bin/python -m pytest "$@" tests/host tests/container >"$beside" 2>&1 &
host_pid=$!
set +e
.venv/bin/python -m pytest "$@" tests/integration
integration=$?
wait "$host_pid"
host=$?
set -e
echo
echo "=== tests/host and tests/container (run beside the integration tests above) ==="
cat "$beside"
echo "=== integration: exit $integration; host and container: exit $host ==="
if [ "$integration" -ne 0 ]; then exit "$integration"; fi
exit "$host"
