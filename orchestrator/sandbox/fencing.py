"""Volume fencing: a group's volumes are mounted on one machine at a time.

The workspace and session folder volumes (``quota/``) are ext4 images in a
data dir that a fleet shares between machines; two kernels mounting one image
at once corrupt it.  The database's ``volume_holds`` (``store/volume_holds.py``)
names the host that may mount a group's volumes.  Here, the two moments that
use it:

* before a run that may mount a volume (:func:`hold_for_attempt`), the run's
  host claims the hold: refused (``VolumeHeldElsewhere``: the group waits,
  ``run/pipeline.py``) while another host may still have it mounted; a host
  of this machine's hold is taken over at once (one kernel, one mount: the
  claimer holds the group's lease, so no process of the other runs it);
* every heartbeat beat, after the warm containers of groups that moved away
  were stopped (:func:`release_moved`), the holder hands a moved group's
  volumes to its new host when that is of this machine, or unmounts them and
  lets go once nothing of its machine has them open.
"""

from __future__ import annotations

import logging

from orchestrator.core.machine import machine_identity
from orchestrator.core.settings import Settings
from orchestrator.sandbox import mmp
from orchestrator.sandbox.config import parse_container_config, workspace_quota
from orchestrator.sandbox.quota import group_volumes, mounted_group_folders, unmount_group, volume_problem
from orchestrator.sandbox.sessions import keeps_session, session_quota_bytes
from orchestrator.sandbox.warm import WarmPool
from orchestrator.store.db import Database
from orchestrator.store.groups import Group
from orchestrator.store.hosts import ALIVE_WINDOW_S, machine_of
from orchestrator.store.volume_holds import claim, hand_over, held_but_moved, holders, release, shares_mounts

log = logging.getLogger(__name__)


def may_mount(settings: Settings, group: Group, provider: str) -> bool:
    """Could an attempt of ``group`` with ``provider`` loop-mount a volume on this host?"""
    if volume_problem() is not None:
        return False  # this host mounts none (and refuses a group whose files are in one)
    if any(vol.image.exists() for vol in group_volumes(settings, group.folder)):
        return True  # an existing volume is mounted whatever the quota says now
    if settings.sandbox.workspace_quota_mode == "checked":
        return False
    if workspace_quota(settings, parse_container_config(group.container_config)) > 0:
        return True
    return keeps_session(provider) and session_quota_bytes(settings) > 0


def hold_for_attempt(db: Database, settings: Settings, group: Group, provider: str) -> str | None:
    """Claim ``group``'s volumes for this host before an attempt that may mount them; raises
    ``VolumeHeldElsewhere`` while another host holds them that may still have them mounted.
    One read while held already.  Returns the host they were taken over from, if any."""
    if not may_mount(settings, group, provider):
        return None
    return claim(
        db,
        group.folder,
        settings.fleet.effective_host_id,
        gone_after_s=other_machine_after_s(settings, group.folder),
        machine=machine_identity(settings.fleet.machine_id),
    )


def other_machine_after_s(settings: Settings, folder: str) -> float:
    """How long a holder of another machine must have been silent before its hold is taken.

    Images with the multiple-mount protection (``sandbox/mmp.py``) are fenced by the storage:
    whatever the database says, no second kernel mounts one another has mounted, so the hold
    goes with the holder's leases (dead for :data:`ALIVE_WINDOW_S`) and the mount waits for
    the image.  An image made before (no protection yet) is only safe once its machine is
    gone for good: ``ORCHESTRATOR_DEAD_HOST_S``."""
    after = settings.fleet.dead_host_s
    if after <= 0:
        return after  # never
    images = [vol.image for vol in group_volumes(settings, folder) if vol.image.exists()]
    if all(mmp.read_block(image) is not None for image in images):
        return min(after, ALIVE_WINDOW_S)
    return after


def release_moved(db: Database, settings: Settings, pool: WarmPool) -> list[str]:
    """Let go of the volumes of the groups that moved to another host: handed over as they are
    to a host of this machine (its mount is this machine's), else unmounted first, so the new
    host's machine may mount them; a hold is kept while a container of this host still runs
    for the group or a loop device of this machine still has an image."""
    if volume_problem() is not None:
        return []
    released = []
    host = settings.fleet.effective_host_id
    mine = machine_identity(settings.fleet.machine_id)
    for folder, placed in held_but_moved(db, host):
        if any(c.status == "running" for c in pool.find(folder)):
            continue  # a run is still on it: next beat
        if placed is not None and machine_of(db, placed) == mine:
            # Moved to a host of this machine: one kernel, one mount; it takes the hold as it is
            # (unmounting would pull the mount from under that host).
            if hand_over(db, folder, host, placed):
                log.info("group folder %s moved to host %s of this machine: its volumes handed over", folder, placed)
                released.append(folder)
            continue
        if unmount_group(settings, folder) and release(db, folder, host):
            log.info("group folder %s moved to another host: its volumes are unmounted here and let go", folder)
            released.append(folder)
    released += release_foreign(db, settings, pool)
    return released


def release_foreign(db: Database, settings: Settings, pool: WarmPool) -> list[str]:
    """Unmount what this machine still has mounted of groups whose volumes another machine's
    host holds now: a host of this machine died with them mounted and the hold moved on (its
    sandboxes fenced themselves); the new holder's kernel waits for this one to let go
    (``sandbox/mmp.py``).  What a restarted worker's first beat does, and every beat after."""
    mounted = mounted_group_folders(settings)
    if not mounted:
        return []
    mine = machine_identity(settings.fleet.machine_id)
    let_go = []
    for folder, held_by in holders(db, mounted).items():
        theirs = machine_of(db, held_by)
        if theirs is None or shares_mounts(theirs, mine):
            continue  # a host of this machine has them (this one's mount is its mount), or unknown
        if any(c.status == "running" for c in pool.find(folder, any_host=True)):
            continue  # a container of this machine still has it: next beat
        if unmount_group(settings, folder):
            log.warning(
                "group folder %s is held by host %s of another machine: its volumes are unmounted here",
                folder,
                held_by,
            )
            let_go.append(folder)
    return let_go


def fence_cut_off(settings: Settings, pool: WarmPool) -> tuple[int, list[str]]:
    """What a host that cannot reach the database does before another host may take its
    groups (``store/hosts.py``'s self-fence, within :data:`~orchestrator.store.hosts.FENCE_AFTER_S`
    of its last beat, on its own clock): its warm containers go, and every group volume this
    machine has mounted that no running container of this engine uses is unmounted, so another
    machine may mount it as soon as it takes the hold.  A volume still in use (another host of
    this machine that is not cut off) stays.  Returns the containers stopped and the folders
    unmounted."""
    stopped = pool.stop_host()
    unmounted: list[str] = []
    if volume_problem() is not None:
        return stopped, unmounted
    for folder in mounted_group_folders(settings):
        if pool.group_running(folder):
            continue
        if unmount_group(settings, folder):
            unmounted.append(folder)
    return stopped, unmounted
