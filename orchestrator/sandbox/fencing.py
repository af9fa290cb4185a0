"""Volume fencing: a group's volumes are mounted on one machine at a time.

The workspace and session folder volumes (``quota.py``) are ext4 images in a
data dir that a fleet shares between machines; two kernels mounting one image
at once corrupt it.  The database's ``volume_holds`` (``store/volume_holds.py``)
names the host that may mount a group's volumes.  Here, the two moments that
use it:

* before a run that may mount a volume (:func:`hold_for_attempt`), the run's
  host claims the hold: refused (``VolumeHeldElsewhere``: the group waits,
  ``run/pipeline.py``) while another host may still have it mounted; a dead
  host of this machine's hold is taken over at once (one kernel, one mount);
* every heartbeat beat, after the warm containers of groups that moved away
  were stopped (:func:`release_moved`), the holder unmounts a moved group's
  volumes and lets go once nothing of its machine has them open.
"""

from __future__ import annotations

import logging

from orchestrator.core.machine import machine_identity
from orchestrator.core.settings import Settings
from orchestrator.sandbox.config import parse_container_config, workspace_quota
from orchestrator.sandbox.quota import group_volumes, unmount_group, volume_problem
from orchestrator.sandbox.sessions import keeps_session, session_quota_bytes
from orchestrator.sandbox.warm import WarmPool
from orchestrator.store.db import Database
from orchestrator.store.groups import Group
from orchestrator.store.volume_holds import claim, held_but_moved, release

log = logging.getLogger(__name__)


def may_mount(settings: Settings, group: Group, provider: str) -> bool:
    """Could an attempt of ``group`` with ``provider`` loop-mount a volume on this host?"""
    if volume_problem() is not None:
        return False  # this host mounts none (and refuses a group whose files are in one)
    if any(vol.image.exists() for vol in group_volumes(settings, group.folder)):
        return True  # an existing volume is mounted whatever the quota says now
    if settings.workspace_quota_mode == "checked":
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
        settings.effective_host_id,
        gone_after_s=settings.dead_host_s,
        machine=machine_identity(settings.machine_id),
    )


def release_moved(db: Database, settings: Settings, pool: WarmPool) -> list[str]:
    """Unmount the volumes of the groups that moved to another host and let go of their holds,
    so the new host's machine may mount them; a hold is kept while a container of this host
    still runs for the group or a loop device of this machine still has an image."""
    if volume_problem() is not None:
        return []
    released = []
    host = settings.effective_host_id
    for folder in held_but_moved(db, host):
        if any(c.status == "running" for c in pool.find(folder)):
            continue  # a run is still on it: next beat
        if unmount_group(settings, folder) and release(db, folder, host):
            log.info("group folder %s moved to another host: its volumes are unmounted here and let go", folder)
            released.append(folder)
    return released
