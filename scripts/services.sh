#!/usr/bin/env bash
# Start the services the test suite and the embedded run need, if they are
# installed but not running: the Docker engine (no bridge network, no
# iptables: containers run with --network none anyway), Redis and PostgreSQL
# on loopback.
# Safe to run repeatedly.  Logs go to ${SERVICES_LOG_DIR:-/tmp/orchestrator-services}.
set -euo pipefail
logdir="${SERVICES_LOG_DIR:-/tmp/orchestrator-services}"
mkdir -p "$logdir"

docker_up() { docker info >/dev/null 2>&1; }

if ! docker_up; then
  if command -v dockerd >/dev/null && [ "$(id -u)" = 0 ]; then
    echo "services: starting dockerd" >&2
    # containerd may be left over from an earlier dockerd; dockerd starts its own.
    nohup dockerd --bridge=none --iptables=false --ip6tables=false \
      >"$logdir/dockerd.log" 2>&1 &
    for _ in $(seq 1 60); do docker_up && break; sleep 1; done
    docker_up || { echo "services: dockerd did not start; see $logdir/dockerd.log" >&2; tail -20 "$logdir/dockerd.log" >&2; exit 1; }
  else
    echo "services: no Docker engine running (install docker.io and start dockerd as root)" >&2
  fi
fi

redis_up() { (exec 3<>/dev/tcp/127.0.0.1/6379 && printf 'PING\r\n' >&3 && head -c 5 <&3 | grep -q PONG) 2>/dev/null; }

if ! redis_up; then
  if command -v redis-server >/dev/null; then
    echo "services: starting redis-server on 127.0.0.1:6379" >&2
    redis-server --bind 127.0.0.1 --port 6379 --save '' --appendonly no \
      --daemonize yes --logfile "$logdir/redis.log" --dir "$logdir"
    for _ in $(seq 1 30); do redis_up && break; sleep 0.5; done
  else
    echo "services: no Redis server (apt-get install redis-server)" >&2
  fi
fi

# PostgreSQL (Debian's cluster tools) on 127.0.0.1:5432, with a role and a
# database `orchestrator` (password `orchestrator`; CREATEDB so tests can make
# a fresh database per test, pg_signal_backend so DROP DATABASE ... WITH
# (FORCE) may end an autovacuum worker still in it).  Fast when all is there.
pg_up() { pg_isready -q -h 127.0.0.1 -p 5432 >/dev/null 2>&1; }
pg_role_ok() {
  [ "$(PGPASSWORD=orchestrator PGCONNECT_TIMEOUT=3 psql -h 127.0.0.1 -p 5432 -U orchestrator -d orchestrator \
    -XtAqc "SELECT rolcreatedb AND pg_has_role(current_user, 'pg_signal_backend', 'MEMBER')
            FROM pg_roles WHERE rolname = current_user" 2>/dev/null)" = t ]
}
as_postgres() { runuser -u postgres -- "$@"; }

if command -v pg_ctlcluster >/dev/null && command -v pg_isready >/dev/null; then
  if ! pg_up && [ "$(id -u)" = 0 ]; then
    # The cluster on port 5432, else the newest installed version's `main`.
    cluster=$(pg_lsclusters -h 2>/dev/null | awk '$3 == 5432 {print $1" "$2; exit}')
    if [ -z "$cluster" ]; then
      ver=$(ls /usr/lib/postgresql 2>/dev/null | sort -n | tail -1)
      if [ -n "$ver" ]; then
        echo "services: creating PostgreSQL cluster $ver main" >&2
        if pg_createcluster -p 5432 "$ver" main >"$logdir/pg_createcluster.log" 2>&1; then
          cluster="$ver main"
        else
          echo "services: pg_createcluster failed; see $logdir/pg_createcluster.log" >&2
        fi
      fi
    fi
    if [ -n "$cluster" ]; then
      echo "services: starting PostgreSQL $cluster on 127.0.0.1:5432" >&2
      # shellcheck disable=SC2086
      pg_ctlcluster $cluster start >"$logdir/postgresql.log" 2>&1 || true
      for _ in $(seq 1 60); do pg_up && break; sleep 0.5; done
      # shellcheck disable=SC2086
      pg_up || { echo "services: PostgreSQL did not start; see $logdir/postgresql.log and /var/log/postgresql/postgresql-${cluster// /-}.log" >&2; cat "$logdir/postgresql.log" >&2; exit 1; }
    fi
  fi
  if pg_up && ! pg_role_ok; then
    if [ "$(id -u)" = 0 ]; then
      echo "services: creating PostgreSQL role and database 'orchestrator'" >&2
      if as_postgres psql -XqAt -v ON_ERROR_STOP=1 -d postgres <<'SQL' >/dev/null
SELECT 'CREATE ROLE orchestrator LOGIN' WHERE NOT EXISTS (SELECT FROM pg_roles WHERE rolname = 'orchestrator')
\gexec
ALTER ROLE orchestrator LOGIN CREATEDB PASSWORD 'orchestrator';
GRANT pg_signal_backend TO orchestrator;
SELECT 'CREATE DATABASE orchestrator OWNER orchestrator' WHERE NOT EXISTS (SELECT FROM pg_database WHERE datname = 'orchestrator')
\gexec
SQL
      then :; else echo "services: could not create the PostgreSQL role/database" >&2; fi
      pg_role_ok || echo "services: cannot log in to PostgreSQL as orchestrator@127.0.0.1 (check pg_hba.conf)" >&2
    else
      echo "services: PostgreSQL has no role/database 'orchestrator' (run this script as root once)" >&2
    fi
  elif ! pg_up; then
    echo "services: PostgreSQL is not running (run this script as root to start it)" >&2
  fi
else
  echo "services: no PostgreSQL server (apt-get install postgresql)" >&2
fi
