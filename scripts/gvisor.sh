#!/usr/bin/env bash
# Install gVisor's runsc (Debian's package) and register it with the Docker engine as
# the runtime `runsc`, the documented way: `runsc install` writes it into the engine's
# daemon.json, and SIGHUP makes a running dockerd reload its runtimes without a restart
# (a restart would kill the containers running now).  Safe to run repeatedly.
#
# The runtime's arguments (docs/sandbox.md, "gVisor"):
#   --platform=ptrace   the KVM platform hangs at boot on this kind of machine (a VM)
#   --network=none      agent containers have no network anyway
#   --host-uds=all      a unix socket crosses a bind mount both ways: the warm runner's
#                       socket in the workspace, the model gateway's into the sandbox
# No --ignore-cgroups: without cgroups Docker's memory, CPU and pid limits are not
# enforced, and the orchestrator's probe (sandbox/runtime.py) refuses such a runsc.
#
# --test-runtimes also registers the two wrong ways the tests prove the probe refuses
# (tests/integration/test_gvisor.py): `runsc-nocgroups` (--ignore-cgroups) and
# `runsc-nouds` (no --host-uds).  Never used by the orchestrator.
set -euo pipefail
if [ "$(id -u)" != 0 ]; then
  echo "gvisor: needs root (apt-get, /etc/docker/daemon.json, dockerd's SIGHUP)" >&2
  exit 1
fi
if ! command -v runsc >/dev/null; then
  echo "gvisor: installing runsc" >&2
  DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends runsc >&2 \
    || { apt-get update -q >&2 && DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends runsc >&2; }
fi
want='--platform=ptrace --network=none --host-uds=all'
registered() { docker info --format '{{json .Runtimes}}' 2>/dev/null | grep -q "\"$1\""; }
if registered runsc && { [ "${1:-}" != --test-runtimes ] || registered runsc-nouds; }; then
  echo "gvisor: runsc is registered" >&2
  exit 0
fi
# shellcheck disable=SC2086 # the arguments are words
runsc install --runtime runsc -- $want
if [ "${1:-}" = --test-runtimes ]; then
  runsc install --runtime runsc-nocgroups -- $want --ignore-cgroups
  runsc install --runtime runsc-nouds -- --platform=ptrace --network=none
fi
pid=$(pgrep -xo dockerd || true)
if [ -z "$pid" ]; then
  echo "gvisor: registered in /etc/docker/daemon.json; dockerd is not running (it reads it at start)" >&2
  exit 0
fi
kill -HUP "$pid"
for _ in $(seq 1 20); do
  if registered runsc && { [ "${1:-}" != --test-runtimes ] || registered runsc-nouds; }; then
    echo "gvisor: runsc registered and the engine reloaded" >&2
    exit 0
  fi
  sleep 0.5
done
echo "gvisor: the engine did not pick up runsc; see /etc/docker/daemon.json" >&2
exit 1
