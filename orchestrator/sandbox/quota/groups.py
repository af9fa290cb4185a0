"""A group's volumes on this machine: its workspace's and its session folder's, found, mounted and unmounted.

What a host does with a group's volumes as a whole: mount them once it holds them, before
its run is created (:func:`mount_existing`), let them go when the group moves to another
host (:func:`unmount_group`, after which ``store/volume_holds.py`` may hand them over),
list the groups with one mounted here (:func:`mounted_group_folders`), and unmount them all
(:func:`unmount_all`, ``orchestrator groups unmount-volumes``).  A replay's scratch volumes are
not a group's (``scratch.py``).
"""

from __future__ import annotations

import logging

from orchestrator.core.errors import WorkspaceQuotaError
from orchestrator.core.settings import Settings
from orchestrator.sandbox.quota.loop import VolumeUnavailable, loop_devices_of, still_attached
from orchestrator.sandbox.quota.mode import volume_problem
from orchestrator.sandbox.quota.volume import SCRATCH_PREFIX, SESSION_PREFIX, Volume, volumes_dir

log = logging.getLogger(__name__)


def group_volumes(settings: Settings, folder: str) -> list[Volume]:
    """The volumes a group has (its workspace's, its session folder's), mounted or not."""
    return [
        Volume.of(settings, folder),
        Volume.of(settings, SESSION_PREFIX + folder, settings.sessions_dir / folder, group=folder),
    ]


def _volume_named(settings: Settings, name: str) -> Volume | None:
    """The group volume an image's name stands for (None: a replay's scratch volume)."""
    if name.startswith(SCRATCH_PREFIX):
        return None
    if name.startswith(SESSION_PREFIX):
        return group_volumes(settings, name[len(SESSION_PREFIX) :])[1]
    return Volume.of(settings, name)


def mount_existing(settings: Settings, folder: str) -> None:
    """Mount the group's volumes that exist and are not mounted on this machine, as they are
    (no growth: the run's preparation does that): what a host does once it holds them, before
    its run is created, so that a volume another machine still has mounted
    (:class:`VolumeMountedElsewhere`) makes the group wait rather than fail a run."""
    if volume_problem() is not None:
        return
    for vol in group_volumes(settings, folder):
        if vol.image.exists() and vol.mounted() is None:
            vol.ensure(0)


def unmount_group(settings: Settings, folder: str) -> bool:
    """Unmount the group's volumes on this machine (a group that moved to another host); True
    once none is mounted nor its image attached to a loop device here any more: only then
    may another machine mount them (``store/volume_holds.py``)."""
    free = True
    for vol in group_volumes(settings, folder):
        if not vol.image.exists():
            continue
        try:
            vol.unmount()
        except VolumeUnavailable as exc:
            log.warning("could not unmount the volume %s of %s: %s", vol.image, folder, exc)
            free = False
            continue
        if still_attached(vol.image):
            # Still held in another mount namespace (a container that has not exited yet).
            free = False
    return free


def mounted_group_folders(settings: Settings) -> list[str]:
    """The group folders with a volume mounted on this machine (its workspace's or its
    session folder's), read from the images' loop devices and this mount table."""
    vdir = volumes_dir(settings)
    if not vdir.is_dir():
        return []
    found: dict[str, None] = {}
    for image in sorted(vdir.glob("*.img")):
        vol = _volume_named(settings, image.name[: -len(".img")])
        if vol is not None and loop_devices_of(vol.image) and vol.mounted() == "ours":
            found[vol.group or vol.folder] = None
    return list(found)


def unmount_all(settings: Settings) -> list[str]:
    """Unmount every group volume of this data dir (the images stay); returns their names."""
    done: list[str] = []
    vdir = volumes_dir(settings)
    if not vdir.is_dir():
        return done
    for image in sorted(vdir.glob("*.img")):
        folder = image.name[: -len(".img")]
        vol = _volume_named(settings, folder)
        if vol is None:
            continue
        try:
            if vol.unmount():
                done.append(folder)
        except VolumeUnavailable as exc:  # even the lazy umount failed: say which, as the CLI's one-line error
            raise WorkspaceQuotaError(f"could not unmount the workspace volume of {folder!r}: {exc}") from exc
    return done
