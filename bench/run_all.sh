#!/usr/bin/env bash
# Every benchmark, one after another, each against its baseline measured in
# the same command (docs/performance.md).  Timing needs a quiet machine: on a
# shared one, hold the Docker lock for the whole run:
#
#     flock /tmp/docker-tests.lock bench/run_all.sh
#
# BENCH_PG / BENCH_REDIS name the PostgreSQL server (a role that may create
# databases) and the Redis database for the fleet figures (bench.recovery,
# bench.delivery and bench.control_plane flush it; bench.db_reach needs PostgreSQL only); set them empty to skip those.  BENCH_QUICK=1 runs every benchmark small (a smoke test).
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-.venv/bin/python}
PG=${BENCH_PG-postgresql://orchestrator:orchestrator@127.0.0.1:5432/orchestrator}
REDIS=${BENCH_REDIS-redis://127.0.0.1:6379/14}
fleet=()
[ -n "$PG" ] && fleet+=(--pg "$PG")
[ -n "$PG" ] && [ -n "$REDIS" ] && fleet+=(--redis "$REDIS")

if [ "${BENCH_QUICK:-0}" = 1 ]; then
  ingest=(--messages 300 --rounds 3); history=(--total 20000 --groups 50 --sizes 500,2000,5000 --reps 3)
  throughput=(--groups 4 --messages 2 --raw 3); memory=(--runs 2); overhead=(--runs 3); cli=(--runs 2); gateway=(--rounds 1 --cycles 5 --requests 20 --long 20)
  recovery=(--trials 1 --baseline-trials 0); delivery=(--messages 2 --busy-s 5); continuity=(--turns 8)
  wakeup=(--runs 3 --idle-s 5 --rounds 1); api=(--requests 100 --rounds 1)
  streaming=(--runs 2 --words 20); stream_push=(--deltas 20 --idle-s 3); egress=(--requests 30 --megabytes 20)
  control_plane=(--workers 1,2 --groups 12 --seconds 4 --warmup 2 --noop 60); db_reach=(--seconds 3 --clients 2 --per-client 3)
  claude_code=(--runs 2); run_path=(--runs 3); warm_stages=(--runs 3)
else
  ingest=(); history=(); throughput=(); memory=(); overhead=(); cli=(); gateway=(); recovery=(); delivery=(); continuity=()
  wakeup=(); api=()
  streaming=(); stream_push=(); egress=(); control_plane=(); db_reach=(); claude_code=(); run_path=(); warm_stages=()
fi

echo "== $(date -u '+%Y-%m-%d %H:%M UTC'), $(git rev-parse --short HEAD)$(git diff --quiet || echo '+changes')"
echo "== $(nproc) CPUs ($(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | xargs)), $(free -g | awk '/Mem:/ {print $2}') GiB," \
     "Docker $(docker version -f '{{.Server.Version}}' 2>/dev/null || echo '?'), load $(cut -d' ' -f1-3 /proc/loadavg)"
echo; echo "== ingest";      "$PY" -m bench.ingest "${ingest[@]}" "${fleet[@]}"
echo; echo "== history";     "$PY" -m bench.history "${history[@]}" ${PG:+--pg "$PG"}
echo; echo "== throughput";  "$PY" -m bench.throughput "${throughput[@]}"
echo; echo "== memory";      "$PY" -m bench.memory "${memory[@]}"
echo; echo "== overhead";    "$PY" -m bench.overhead "${overhead[@]}"
echo; echo "== warm stages"; "$PY" -m bench.warm_stages "${warm_stages[@]}"
echo; echo "== run path";    "$PY" -m bench.run_path "${run_path[@]}"
echo; echo "== claude code"; "$PY" -m bench.claude_code "${claude_code[@]}"
echo; echo "== wakeup";      "$PY" -m bench.wakeup "${wakeup[@]}"
echo; echo "== api";         "$PY" -m bench.api "${api[@]}" "${fleet[@]}"
echo; echo "== cli";         "$PY" -m bench.cli "${cli[@]}"
echo; echo "== gateway";     "$PY" -m bench.gateway "${gateway[@]}"
echo; echo "== recovery";    "$PY" -m bench.recovery "${recovery[@]}" "${fleet[@]}"
if [ -n "$PG" ] && [ -n "$REDIS" ]; then  # PostgreSQL + Redis only: the fleet's stack
  echo; echo "== control plane"; "$PY" -m bench.control_plane "${control_plane[@]}" "${fleet[@]}"
fi
if [ -n "$PG" ]; then  # the database's reach: pgbench replays the run path's statements
  echo; echo "== db reach"; "$PY" -m bench.db_reach "${db_reach[@]}" --pg "$PG"
fi
echo; echo "== delivery";    "$PY" -m bench.delivery "${delivery[@]}" "${fleet[@]}"
echo; echo "== continuity";  "$PY" -m bench.continuity "${continuity[@]}" 2>/dev/null
echo; echo "== streaming";   "$PY" -m bench.streaming "${streaming[@]}" "${fleet[@]}"
echo; echo "== stream push"; "$PY" -m bench.stream_push "${stream_push[@]}" ${PG:+--pg "$PG"}
echo; echo "== egress";      "$PY" -m bench.egress "${egress[@]}"
