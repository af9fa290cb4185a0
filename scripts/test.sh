#!/usr/bin/env bash
# Run the test suite (docs/testing.md): make the virtualenv, start Docker, Redis and
# PostgreSQL if they are installed but stopped, then pytest.  Extra arguments go to pytest.
#
#   ./scripts/test.sh                     the whole suite, in three processes (below)
#   ./scripts/test.sh --quick             the tests that need no service: not docker, browser,
#                                         postgres, redis nor integration (tests/markers.py);
#                                         starts no service; ${QUICK_PROCESSES:-4} processes
#   ./scripts/test.sh tests/host/x.py -k  the paths given, in one pytest
#
# With no test paths among the arguments, several pytest processes run at once and share
# the test files (tests/file_claims.py: each file is run by whichever process reaches it
# first, the longest first by the last run's durations).  For the whole suite, three: two
# go through tests/integration first (workers, containers and timings; each with a Redis
# database of its own: 15 and 11), then help with tests/host and tests/container, which
# the third starts on at once (they start no container and use Redis databases of their
# own: 0 with a key prefix, 12; the benchmarks use 13).  The reports are printed one after
# another.
#
# Every run writes each test file's duration to ${ORCHESTRATOR_TEST_DURATIONS:-data/test-durations.json}
# (tests/durations.py; `.venv/bin/python -m tests.durations summary` prints the slowest).
set -euo pipefail
cd "$(dirname "$0")/.."
quick=0
if [ "${1:-}" = "--quick" ]; then
  quick=1
  shift
fi
py="${PYTHON:-python3}"
[ -x .venv/bin/python ] || "$py" -m venv .venv
# Installed again only when pyproject.toml changed (a stamp named after its hash): pip takes
# ~6 s even with nothing to do, a twentieth of the quick tier.
stamp=".venv/.installed-$(sha256sum pyproject.toml | cut -c1-16)"
if [ ! -e "$stamp" ]; then
  .venv/bin/python -m pip install -q --disable-pip-version-check -e '.[test]'
  rm -f .venv/.installed-*
  touch "$stamp"
fi
[ "$quick" = 1 ] || bash scripts/services.sh

work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT
mkdir "$work/durations" "$work/claims"
export ORCHESTRATOR_TEST_DURATIONS="${ORCHESTRATOR_TEST_DURATIONS:-$PWD/data/test-durations.json}"

# The run's kind (tests/durations.py): a selection of its own makes it partial.
kind=whole
[ "$quick" = 1 ] && kind=quick
paths=0
for arg in "$@"; do
  if [ -e "${arg%%::*}" ]; then paths=1; fi
  case "$arg" in
    -k* | -m* | -x | --exitfirst | --maxfail* | --lf | --last-failed | --deselect* | --sw | --stepwise) kind=partial ;;
  esac
done
[ "$paths" = 1 ] && kind=partial

# One pytest process: its label, then its arguments; its durations go to a part of its own.
pytest_as() {
  local label="$1"
  shift
  ORCHESTRATOR_TEST_PROCESS="$label" ORCHESTRATOR_TEST_DURATIONS_PART="$work/durations/$label.json" \
    .venv/bin/python -m pytest "$@"
}
durations() {
  .venv/bin/python -m tests.durations merge --kind "$kind" --args="$*" "$ORCHESTRATOR_TEST_DURATIONS" \
    "$work"/durations/*.json || echo "test.sh: the durations were not recorded" >&2
}

quick_marks="not docker and not browser and not postgres and not redis and not integration"
selection=()
[ "$quick" = 1 ] && selection=(-m "$quick_marks")

if [ "$paths" = 1 ]; then
  set +e
  pytest_as paths "${selection[@]}" "$@"
  code=$?
  set -e
  durations "$@"
  exit "$code"
fi

export ORCHESTRATOR_TEST_CLAIMS="$work/claims" ORCHESTRATOR_TEST_RUN_KIND="$kind"
labels=()
pids=()
if [ "$quick" = 1 ]; then
  # tests/integration is all `integration` (tests/markers.py): not even collected (collecting,
  # which rewrites each module's asserts, costs each process CPU time).
  n="${QUICK_PROCESSES:-4}"
  for i in $(seq 2 "$n"); do
    pytest_as "quick-$i" "${selection[@]}" "$@" tests --ignore=tests/integration >"$work/quick-$i.log" 2>&1 &
    labels+=("quick-$i")
    pids+=($!)
  done
  first=quick-1
  set +e
  pytest_as quick-1 "${selection[@]}" "$@" tests --ignore=tests/integration
else
  pytest_as host "$@" tests/host tests/container >"$work/host.log" 2>&1 &
  labels+=(host)
  pids+=($!)
  ORCHESTRATOR_TEST_REDIS_DB=11 \
    pytest_as integration-2 "$@" tests/integration tests/host tests/container >"$work/integration-2.log" 2>&1 &
  labels=(integration-2 "${labels[@]}")
  pids=($! "${pids[@]}")
  first=integration-1
  set +e
  ORCHESTRATOR_TEST_REDIS_DB=15 pytest_as integration-1 "$@" tests/integration tests/host tests/container
fi
codes=("$?")
for pid in "${pids[@]}"; do
  wait "$pid"
  codes+=("$?")
done
set -e
for label in "${labels[@]}"; do
  echo
  case "$label" in
    integration-2) echo "=== the second process: tests/integration, then its share of tests/host and tests/container ===" ;;
    host) echo "=== the third process: tests/host and tests/container (beside the two above) ===" ;;
    *) echo "=== process $label ===" ;;
  esac
  cat "$work/$label.log"
done
durations "$@"
all=("$first" "${labels[@]}")
echo "=== exits: $(for i in "${!all[@]}"; do printf '%s %s; ' "${all[$i]}" "${codes[$i]}"; done)==="
for code in "${codes[@]}"; do
  if [ "$code" -ne 0 ]; then exit "$code"; fi
done
exit 0
