#!/usr/bin/env bash
# Start the services the test suite and the embedded run need, if they are
# installed but not running: the Docker engine (no bridge network, no
# iptables: containers run with --network none anyway) and Redis on loopback.
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
