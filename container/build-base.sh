#!/usr/bin/env bash
# Build a minimal local base image (Debian bookworm + python3) without any
# container registry: debootstrap a minbase root filesystem from Debian's
# package mirror and `docker import` it.  Used when BASE_IMAGE is not present
# locally (see docs/architecture.md, "Images").
#
# usage: container/build-base.sh [IMAGE_TAG]   (default orchestrator-base:bookworm-net)
set -euo pipefail
tag="${1:-orchestrator-base:bookworm-net}"
suite="${DEBIAN_SUITE:-bookworm}"
mirror="${DEBIAN_MIRROR:-http://deb.debian.org/debian}"

if ! command -v debootstrap >/dev/null; then
  echo "build-base: debootstrap is required (apt-get install debootstrap)" >&2
  exit 1
fi
root="$(mktemp -d /tmp/orchestrator-base.XXXXXX)"
trap 'rm -rf "$root"' EXIT
debootstrap --variant=minbase --include=python3,python3-venv,ca-certificates,git,curl \
  "$suite" "$root" "$mirror" >&2
# git: agents work on repositories, and the runner computes the
# "uncommitted changes" notice inside the sandbox (never on the host).
# curl and python3-venv (a venv's pip): the clients a group whose network
# policy lets something out uses through the egress proxy.
# Trim what a sandbox never needs: docs, man pages, apt lists and caches.
rm -rf "$root"/usr/share/doc/* "$root"/usr/share/man/* "$root"/usr/share/info/* \
       "$root"/var/lib/apt/lists/* "$root"/var/cache/apt/*.bin "$root"/var/cache/apt/archives/*.deb
tar -C "$root" -c . | docker import \
  --change 'ENV LANG=C.UTF-8' \
  --change 'ENV PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin' \
  --change 'CMD ["/bin/bash"]' - "$tag" >&2
echo "$tag"
