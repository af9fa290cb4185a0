#!/usr/bin/env bash
# Run the whole test suite: make the virtualenv, start Docker, Redis and
# PostgreSQL if they are installed but stopped, then pytest.  Extra arguments
# go to pytest.
#
# With no test paths among the arguments, three pytest processes run at once:
# two share tests/integration (workers, containers and timings; each test file
# is run by whichever process reaches it first, longest files first, each with
# a Redis database of its own: 15 and 11), and tests/host and tests/container
# run beside them, which start no container and use Redis databases of their
# own (0 with a key prefix, 12; the benchmarks use 13).  The reports are
# printed one after another.  Given paths, one pytest runs them.
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
work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT
mkdir "$work/claims"
.venv/bin/python -m pytest "$@" tests/host tests/container >"$work/host.log" 2>&1 &
host_pid=$!
ORCHESTRATOR_TEST_CLAIMS="$work/claims" ORCHESTRATOR_TEST_REDIS_DB=11 \
  .venv/bin/python -m pytest "$@" tests/integration >"$work/integration-2.log" 2>&1 &
second_pid=$!
set +e
ORCHESTRATOR_TEST_CLAIMS="$work/claims" ORCHESTRATOR_TEST_REDIS_DB=15 .venv/bin/python -m pytest "$@" tests/integration
first=$?
wait "$second_pid"
second=$?
wait "$host_pid"
host=$?
set -e
echo
echo "=== tests/integration, the second process (run beside the one above) ==="
cat "$work/integration-2.log"
echo
echo "=== tests/host and tests/container (run beside the integration tests above) ==="
cat "$work/host.log"
echo "=== integration: exit $first and $second; host and container: exit $host ==="
for code in "$first" "$second" "$host"; do
  if [ "$code" -ne 0 ]; then exit "$code"; fi
done
exit 0
