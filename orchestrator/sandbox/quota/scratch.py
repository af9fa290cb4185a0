"""Scratch volumes: a replay's throw-away copy of a workspace, bounded like the workspace itself.

A replay (``run/replay.py``) runs a recorded input on a copy of the group's workspace; on a
host that can loop-mount, the copy is a volume of the group's quota, so what the replayed
agent writes stops there.  Its image is named ``replay.<name>`` (no group folder holds a
dot), held by a lock only a live process keeps, and removed on the way out; a killed
worker's is removed by the next scratch volume of the data dir.
"""

from __future__ import annotations

import contextlib
import fcntl
import logging
import os
from collections.abc import Iterator
from pathlib import Path

from orchestrator.core.errors import WorkspaceQuotaError
from orchestrator.core.settings import Settings
from orchestrator.sandbox.late_mounts import mount_entries
from orchestrator.sandbox.quota.loop import VolumeUnavailable, loop_backing_file, run_tool, still_attached
from orchestrator.sandbox.quota.mode import quota_mode, volume_problem
from orchestrator.sandbox.quota.volume import SCRATCH_PREFIX, Volume, volumes_dir

log = logging.getLogger(__name__)


@contextlib.contextmanager
def scratch_volume(settings: Settings, name: str, where: Path, quota: int) -> Iterator[bool]:
    """A throw-away volume of ``quota`` bytes mounted at the empty folder ``where`` for the
    block's life (a replay's scratch copy): what a container writes there stops at the
    quota, as in the group's own workspace.  Yields whether it is bounded: not when there
    is no quota, nor where this host cannot loop-mount (checked mode, which measures
    before a run, cannot stop one that writes as it goes: such a host says so at start).

    On the way out the volume is unmounted and its image deleted.  A worker killed in
    the block leaves both; the next scratch volume of the data dir removes them (each
    one in use holds a lock its process's death releases)."""
    if quota == 0 or quota_mode(settings, quota)[0] != "volume" or volume_problem() is not None:
        yield False
        return
    vdir = volumes_dir(settings)
    vdir.mkdir(mode=0o700, parents=True, exist_ok=True)
    remove_stale_scratch(settings)
    vol = Volume.of(settings, SCRATCH_PREFIX + name, where)
    in_use = os.open(vdir / f"{vol.folder}.inuse", os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
    try:
        fcntl.flock(in_use, fcntl.LOCK_EX)
        try:
            vol.ensure(quota)
        except VolumeUnavailable as exc:
            raise WorkspaceQuotaError(f"cannot bound the scratch copy with a volume: {exc}") from exc
        try:
            yield True
        finally:
            _discard_scratch(vol)
    finally:
        os.close(in_use)  # the lock goes with it


def remove_stale_scratch(settings: Settings) -> list[str]:
    """Unmount and delete the scratch volumes no live process holds (a killed replay's)."""
    vdir = volumes_dir(settings)
    removed: list[str] = []
    for image in sorted(vdir.glob(f"{SCRATCH_PREFIX}*.img")):
        folder = image.name[: -len(".img")]
        try:
            fd = os.open(vdir / f"{folder}.inuse", os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
        except OSError:
            continue
        try:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                continue  # in use
            backing = str(Path(os.path.realpath(vdir)) / image.name)
            mounted = [
                m.mount_point
                for m in mount_entries()
                if m.source.startswith("/dev/loop") and loop_backing_file(m.source) == backing
            ]
            for where in mounted:
                _discard_scratch(Volume(settings, folder, Path(where)))
            if not mounted:
                _discard_scratch(Volume(settings, folder, vdir / f"{folder}.none"))
            removed.append(folder)
        finally:
            os.close(fd)
    return removed


def _discard_scratch(vol: Volume) -> None:
    try:
        vol.unmount()
    except VolumeUnavailable as exc:  # even the lazy unmount failed: the image stays, for the next try
        log.warning("could not unmount the scratch volume %s: %s", vol.image, exc)
        return
    # The kernel detaches the autoclear loop device a moment after the last unmount;
    # wait for it so that leaving the block leaves nothing, and detach it if it lingers.
    for dev in still_attached(vol.image):
        try:
            run_tool(["losetup", "-d", dev])
        except VolumeUnavailable as exc:
            log.warning("could not detach %s from the scratch volume %s: %s", dev, vol.image, exc)
    for path in (vol.image, vol.lock, volumes_dir(vol.settings) / f"{vol.folder}.inuse"):
        with contextlib.suppress(FileNotFoundError):
            path.unlink()
