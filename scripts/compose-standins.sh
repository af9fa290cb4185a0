#!/usr/bin/env bash
# Local stand-ins for the images compose.yaml names, for a machine with no
# container registry (CI here), so the stack starts for real with
# deploy/compose.local.yaml (tests/integration/test_compose_up.py):
#
#   orchestrator-standin:debian-services  debootstrap of Debian's postgresql and
#                                         redis-server (docker import), the root
#                                         file system of the next two
#   orchestrator-standin:postgres         for postgres:16 (deploy/standins/postgres)
#   orchestrator-standin:redis            for redis:7 (deploy/standins/redis)
#   orchestrator-standin:python           for python:3.11-slim: the agent's local base
#                                         image + pip + a wheelhouse (deploy/standins/python)
#   orchestrator-standin:service          the root Dockerfile built FROM that, offline
#
# Safe to run again, and quick (about 3 s when nothing changed, 10-15 s when
# the source did): the debootstrap and the Python base are redone only when
# their inputs change (a hash label on each image), the rest are `docker
# build`s whose layer cache makes an unchanged one a no-op; downloads (wheels,
# .debs) are cached under the data dir's build/standins/.  A stand-in replaced
# by a new build is removed.  The first run needs root (debootstrap), Docker
# and the package mirrors (Debian, PyPI): a few minutes.
set -euo pipefail
cd "$(dirname "$0")/.."
repo="$PWD"
py="${PYTHON:-$repo/.venv/bin/python}"
[ -x "$py" ] || py=python3
cache="${ORCHESTRATOR_DATA_DIR:-$repo/data}/build/standins"
suite="${DEBIAN_SUITE:-bookworm}"
mirror="${DEBIAN_MIRROR:-http://deb.debian.org/debian}"
base="${ORCHESTRATOR_BASE_IMAGE:-orchestrator-base:bookworm-net}"
label=orchestrator.build-hash
mkdir -p "$cache"
replaced=()

say() { echo "compose-standins: $*" >&2; }
image_id() { docker image inspect -f '{{.Id}}' "$1" 2>/dev/null || true; }
label_of() { docker image inspect -f "{{index .Config.Labels \"$label\"}}" "$1" 2>/dev/null || true; }
sha() { sha256sum | cut -c1-16; }

# docker build TAG CONTEXT [ARGS...], offline; the image it replaces is removed at the end.
build() {
  local tag="$1" ctx="$2" old
  shift 2
  old="$(image_id "$tag")"
  # The log only when it fails (the legacy builder's deprecation notice otherwise).
  if ! docker build --network none --rm --force-rm -t "$tag" "$@" "$ctx" >"$cache/build.log" 2>&1; then
    tail -40 "$cache/build.log" >&2
    say "building $tag failed (log: $cache/build.log)"
    exit 1
  fi
  if [ -n "$old" ] && [ "$old" != "$(image_id "$tag")" ]; then replaced+=("$old"); fi
}

# 1. The services' root file system: one debootstrap for PostgreSQL and Redis.
rootfs=orchestrator-standin:debian-services
packages="postgresql-15,redis-server"
# trim-1: what is removed below; a new value when that changes.
key="$(printf '%s\n' "$suite" "$mirror" "$packages" "trim-1" | sha)"
if [ "$(label_of "$rootfs")" != "$key" ]; then
  command -v debootstrap >/dev/null || { say "debootstrap is required (apt-get install debootstrap)"; exit 1; }
  [ "$(id -u)" = 0 ] || { say "debootstrap needs root"; exit 1; }
  say "debootstrapping $suite with $packages (about a minute; once)"
  root="$(mktemp -d /tmp/orchestrator-standin.XXXXXX)"
  trap 'rm -rf "$root"' EXIT
  mkdir -p "$cache/debs"
  debootstrap --variant=minbase --include="$packages" --cache-dir="$cache/debs" \
    "$suite" "$root" "$mirror" >"$cache/debootstrap.log" 2>&1 \
    || { tail -30 "$cache/debootstrap.log" >&2; exit 1; }
  # The package's own cluster (the entrypoint makes one in PGDATA), docs, caches.
  rm -rf "$root"/etc/postgresql/*/main "$root"/var/lib/postgresql/*/main \
         "$root"/usr/share/doc/* "$root"/usr/share/man/* "$root"/usr/share/info/* \
         "$root"/var/lib/apt/lists/* "$root"/var/cache/apt/*.bin "$root"/var/cache/apt/archives/*.deb
  old="$(image_id "$rootfs")"
  tar -C "$root" -c . | docker import \
    --change 'ENV LANG=C.UTF-8' \
    --change 'ENV PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin' \
    --change "LABEL $label=$key" \
    --change 'CMD ["/bin/bash"]' - "$rootfs" >/dev/null
  if [ -n "$old" ]; then replaced+=("$old"); fi
  rm -rf "$root"
  trap - EXIT
fi

# 2. postgres and redis on it.
build orchestrator-standin:postgres deploy/standins/postgres --build-arg ROOTFS="$rootfs"
build orchestrator-standin:redis deploy/standins/redis --build-arg ROOTFS="$rootfs"

# 3. The Python base: the agent's local base image (made if missing), pip and a
#    wheelhouse of the orchestrator's dependencies for its Python and CPU.
if [ -z "$(image_id "$base")" ]; then
  say "building the local base image $base"
  bash container/build-base.sh "$base" >/dev/null
fi
# The full version: markers such as python_full_version < "3.11.3" (redis's
# async-timeout) must be decided for the image's Python, not the host's.
pyfull="$(docker run --rm --network none "$base" python3 -c 'import sys; print("%d.%d.%d" % sys.version_info[:3])')"
machine="$(uname -m)"
reqs="$("$py" - <<'PY'
import tomllib
with open("pyproject.toml", "rb") as f:
    doc = tomllib.load(f)
print("\n".join([*doc["project"]["dependencies"], *doc["project"]["optional-dependencies"]["otlp"],
                 *doc["build-system"]["requires"], "pip"]))
PY
)"
wheels="$cache/wheels-$(printf '%s\n' "$reqs" "$pyfull" "$machine" | sha)"
# The image carries a hash of its inputs: while it is current nothing is
# downloaded or built (a fresh clone of CI has no wheelhouse, Docker keeps the image).
pykey="$(printf '%s\n' "$(basename "$wheels")" "$(image_id "$base")" \
  "$(sha <deploy/standins/python/Dockerfile)" | sha)"
if [ "$(label_of orchestrator-standin:python)" != "$pykey" ]; then
  if [ ! -f "$wheels/requirements.txt" ]; then
    say "downloading the orchestrator's wheels for Python $pyfull $machine (once)"
    rm -rf "$wheels.tmp"
    mkdir -p "$wheels.tmp"
    printf '%s\n' "$reqs" >"$wheels.tmp/requirements.in"
    "$py" -m pip download --quiet --disable-pip-version-check --only-binary=:all: --no-deps \
      -d "$wheels.tmp" pip
    # pip decides environment markers by the interpreter it runs on, never by
    # --python-version (redis needs async-timeout on 3.11.2, not on 3.11.7): so
    # the image's own Python resolves, in a throw-away container on the host's
    # network, trusting the host's CA bundle (a TLS-inspecting proxy's CA, if any).
    cacert="${PIP_CERT:-/etc/ssl/certs/ca-certificates.crt}"
    trust=()
    if [ -f "$cacert" ]; then trust=(-v "$cacert:/host-ca.crt:ro" -e PIP_CERT=/host-ca.crt); fi
    docker run --rm --network host -v "$wheels.tmp:/wheels" "${trust[@]}" \
      ${PIP_INDEX_URL:+-e PIP_INDEX_URL="$PIP_INDEX_URL"} \
      "$base" sh -c 'set -- /wheels/pip-*.whl; python3 "$1/pip" download --quiet \
        --disable-pip-version-check --only-binary=:all: -d /wheels -r /wheels/requirements.in' \
      || { say "downloading the wheels failed"; exit 1; }
    mv "$wheels.tmp/requirements.in" "$wheels.tmp/requirements.txt"
    mv "$wheels.tmp" "$wheels"
  fi
  # Only the current wheelhouse is kept (one per change to the dependencies).
  find "$cache" -maxdepth 1 -name 'wheels-*' ! -path "$wheels" -exec rm -rf {} +
  ctx="$(mktemp -d /tmp/orchestrator-standin-python.XXXXXX)"
  cp deploy/standins/python/Dockerfile "$ctx/"
  cp -rl "$wheels" "$ctx/wheels" 2>/dev/null || cp -r "$wheels" "$ctx/wheels"
  build orchestrator-standin:python "$ctx" --build-arg BASE_IMAGE="$base" --label "$label=$pykey"
  rm -rf "$ctx"
fi

# 4. The service image: the root Dockerfile as a user builds it, on that base, offline.
build orchestrator-standin:service . --build-arg BASE_IMAGE=orchestrator-standin:python \
  --build-arg PIP_NO_INDEX=1 --build-arg PIP_FIND_LINKS=/wheels

# Newest first, so an old base goes after the old image built on it.
for ((i = ${#replaced[@]} - 1; i >= 0; i--)); do
  docker rmi "${replaced[$i]}" >/dev/null 2>&1 || true
done
docker images orchestrator-standin --format '{{.Repository}}:{{.Tag}} {{.ID}} {{.Size}}'
