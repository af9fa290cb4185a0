#!/bin/bash
# The official postgres image's interface, on Debian's postgresql package:
# POSTGRES_USER / POSTGRES_PASSWORD / POSTGRES_DB make the cluster on first
# start (an empty PGDATA), options after the image name go to `postgres`, and
# the server runs as the postgres user with PID 1 (docker stop is a clean
# shutdown).  Only what compose.yaml uses; no /docker-entrypoint-initdb.d.
set -euo pipefail
if [ "${1:0:1}" = "-" ]; then
  set -- postgres "$@"
fi
if [ "$1" != postgres ]; then
  exec "$@"
fi
shift
: "${PGDATA:=/var/lib/postgresql/data}"
: "${POSTGRES_USER:=postgres}"
: "${POSTGRES_DB:=$POSTGRES_USER}"
if [ -z "${POSTGRES_PASSWORD:-}" ]; then
  echo "postgres stand-in: set POSTGRES_PASSWORD (as the official image requires)" >&2
  exit 1
fi
as_postgres() { setpriv --reuid=postgres --regid=postgres --init-groups -- "$@"; }
mkdir -p "$PGDATA" /var/run/postgresql
chown postgres:postgres "$PGDATA" /var/run/postgresql
chmod 700 "$PGDATA"
if [ ! -s "$PGDATA/PG_VERSION" ]; then
  pwfile="$(mktemp)"
  printf '%s\n' "$POSTGRES_PASSWORD" >"$pwfile"
  chown postgres "$pwfile"
  as_postgres initdb -D "$PGDATA" -U "$POSTGRES_USER" --pwfile="$pwfile" \
    --auth-local=trust --auth-host=scram-sha-256 >/dev/null
  rm -f "$pwfile"
  # As the official image: reachable on every address the network gives it,
  # with a password.  A command line -c listen_addresses=... narrows it.
  echo "listen_addresses = '*'" >>"$PGDATA/postgresql.conf"
  echo "host all all all scram-sha-256" >>"$PGDATA/pg_hba.conf"
  if [ "$POSTGRES_DB" != postgres ]; then
    # Over the unix socket only while it is being made.
    as_postgres pg_ctl -D "$PGDATA" -o "-c listen_addresses=''" -w start >/dev/null
    as_postgres psql -XqAt -v ON_ERROR_STOP=1 -U "$POSTGRES_USER" -d postgres \
      -c "CREATE DATABASE \"$POSTGRES_DB\""
    as_postgres pg_ctl -D "$PGDATA" -m fast -w stop >/dev/null
  fi
  echo "postgres stand-in: cluster made in $PGDATA (user $POSTGRES_USER, database $POSTGRES_DB)" >&2
fi
exec setpriv --reuid=postgres --regid=postgres --init-groups -- postgres -D "$PGDATA" "$@"
