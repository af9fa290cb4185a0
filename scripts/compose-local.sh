#!/usr/bin/env bash
# compose.yaml on this machine: with deploy/compose.local.yaml (local stand-in
# images, the host's network, loopback ports; see its header), e.g.
#
#   bash scripts/compose-standins.sh                    # the images, once
#   export ORCHESTRATOR_API_TOKEN=$(openssl rand -hex 32) ORCHESTRATOR_FLOWER_BASIC_AUTH=admin:$(openssl rand -hex 16)
#   export LOCAL_DATA_DIR=/srv/orchestrator-local
#   scripts/compose-local.sh up -d --no-build --scale worker=2
#   scripts/compose-local.sh exec -T api orchestrator hosts
#   scripts/compose-local.sh down -v
#
# Options before the command: -p/--project-name NAME, --env-file FILE.
#
# Why not plain `docker-compose -f compose.yaml -f deploy/compose.local.yaml`:
# compose.yaml publishes the api's and Flower's ports, an override cannot take
# a key away, and docker-compose 1.29 (its docker-py) refuses published ports
# on the host's network, where the engine and compose v2 only drop them.  So
# with 1.29 the merged file is written out (`config`) with those ports dropped,
# as the engine would, and run from there.  With compose v2 the files are used
# as they are.
set -euo pipefail
repo="$(cd "$(dirname "$0")/.." && pwd)"
files=(-f "$repo/compose.yaml" -f "$repo/deploy/compose.local.yaml")
global=()
while [ $# -gt 0 ]; do
  case "$1" in
    -p|--project-name|--env-file) global+=("$1" "$2"); shift 2 ;;
    --project-name=*|--env-file=*) global+=("$1"); shift ;;
    *) break ;;
  esac
done
[ $# -gt 0 ] || { echo "usage: $0 [-p NAME] [--env-file FILE] COMMAND [ARGS...]" >&2; exit 2; }

if ! command -v docker-compose >/dev/null && docker compose version >/dev/null 2>&1; then
  exec docker compose "${global[@]}" "${files[@]}" "$@"
fi
merged="$(mktemp /tmp/compose-local.XXXXXX)"  # holds the API token: 0600, removed on exit
trap 'rm -f "$merged"' EXIT
docker-compose "${global[@]}" "${files[@]}" config >"$merged"
python3 - "$merged" <<'PY'
import sys

import yaml

path = sys.argv[1]
with open(path) as f:
    doc = yaml.safe_load(f)
for service in doc["services"].values():
    if service.get("network_mode") == "host":
        service.pop("ports", None)
with open(path, "w") as f:
    yaml.safe_dump(doc, f, sort_keys=False)
PY
docker-compose "${global[@]}" --project-directory "$repo" -f "$merged" "$@"
