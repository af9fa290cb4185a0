#!/usr/bin/env bash
# Run the whole test suite: make the virtualenv, start Docker, Redis and
# PostgreSQL if they are installed but stopped, then pytest.  Extra arguments
# go to pytest.
#
# With no test paths among the arguments, three pytest processes run at once and
# share the test files (tests/file_claims.py: each file is run by whichever
# process reaches it first): two go through tests/integration first (workers,
# containers and timings; longest files first, each with a Redis database of its
# own: 15 and 11), then help with tests/host and tests/container, which the third
# starts on at once (they start no container and use Redis databases of their own:
# 0 with a key prefix, 12; the benchmarks use 13).  The reports are printed one
# after another.  Given paths, one pytest runs them.
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
export ORCHESTRATOR_TEST_CLAIMS="$work/claims"
.venv/bin/python -m pytest "$@" tests/host tests/container >"$work/host.log" 2>&1 &
host_pid=$!
ORCHESTRATOR_TEST_REDIS_DB=11 \
  .venv/bin/python -m pytest "$@" tests/integration tests/host tests/container >"$work/integration-2.log" 2>&1 &
second_pid=$!
set +e
ORCHESTRATOR_TEST_REDIS_DB=15 .venv/bin/python -m pytest "$@" tests/integration tests/host tests/container
first=$?
wait "$second_pid"
second=$?
wait "$host_pid"
host=$?
set -e
echo
echo "=== the second process: tests/integration, then its share of tests/host and tests/container ==="
cat "$work/integration-2.log"
echo
echo "=== the third process: tests/host and tests/container (beside the two above) ==="
cat "$work/host.log"
echo "=== exits: first $first, second $second, third $host ==="
for code in "$first" "$second" "$host"; do
  if [ "$code" -ne 0 ]; then exit "$code"; fi
done
exit 0
