"""A group whose volumes another host may still have mounted waits for them.

A group's workspace and session folder may be ext4 images that one machine at a time
mounts (``sandbox/fencing.py``).  Before a run starts, or a parked run's next attempt,
its host claims them; while another host may still have them mounted the run does not
start: it holds no worker slot and no place in the fleet's run line, the chat is told
once, and the group is looked at again in :data:`RETRY_S`.  The wait ends when the holder
lets go (it unmounts within a beat of seeing the group moved), when it is a host of this
machine that stopped beating (its mount is this host's: taken over at once), or when it
is another machine's and has stopped beating: the hold moves here, and the mount waits
for that machine's kernel to let go of the image (ext4's multiple-mount protection,
``sandbox/mmp.py``; an image without it waits ``ORCHESTRATOR_DEAD_HOST_S`` instead).
"""

from __future__ import annotations

import hashlib
import logging
from dataclasses import dataclass
from datetime import UTC, datetime

from orchestrator.core.errors import ConfigError, MountRefused, VolumeHeldElsewhere, VolumeMountedElsewhere
from orchestrator.core.settings import Settings
from orchestrator.model.messages import StoredMessage
from orchestrator.run.model_choice import model_settings
from orchestrator.sandbox.fencing import hold_for_attempt
from orchestrator.sandbox.port import Sandbox
from orchestrator.sandbox.quota import mount_existing
from orchestrator.sandbox.warm import LABEL_HOST, WarmPool
from orchestrator.store.db import Database
from orchestrator.store.groups import Group
from orchestrator.store.host_notices import store_once

log = logging.getLogger(__name__)

# How soon a waiting group is looked at again: a live holder lets go within a beat (3 s).
RETRY_S = 2.0
# ... and after another machine's kernel refused the mount: each try costs the kernel's
# multiple-mount check (11 s in the worker's slot, sandbox/mmp.py), so fewer of them.
MOUNTED_RETRY_S = 10.0


@dataclass(frozen=True)
class VolumeWait:
    """The group waits for ``holder`` to let go of its volumes; ``told``: the chat's message,
    when this look stored it (then its deliveries are due)."""

    holder: str
    retry_in: float
    told: StoredMessage | None


def wait_for_volumes(db: Database, settings: Settings, group: Group, sandbox: Sandbox) -> VolumeWait | None:
    """Claim ``group``'s volumes for this host, or the wait for them (None: run now)."""
    try:
        provider = model_settings(settings, group).provider
        taken_from = hold_for_attempt(db, settings, group, provider)
    except VolumeHeldElsewhere as held:
        return VolumeWait(held.holder, RETRY_S, _tell(db, group, f"host {held.holder!r}"))
    except ConfigError:
        return None  # its model or container config: the run fails on it, and says so
    if taken_from is not None and isinstance(sandbox, WarmPool):
        _remove_containers_of(sandbox, group.folder, taken_from)
    try:
        # Held here now: mounted before the run exists, so a kernel that still has the image
        # (another machine's, whatever the database says) makes the group wait, not fail.
        mount_existing(settings, group.folder)
    except VolumeMountedElsewhere as busy:
        return VolumeWait(f"machine {busy.node}", MOUNTED_RETRY_S, _tell(db, group, f"machine {busy.node!r}"))
    except MountRefused:
        return None  # the volume cannot be mounted: the run's own preparation fails on it, and says so
    return None


def _tell(db: Database, group: Group, holder: str) -> StoredMessage | None:
    """``holder``: who has the volumes, as the message names it ("host 'a'", "machine 'vm'")."""
    # One message per batch and holder: the same wait looked at again stores nothing.
    key = hashlib.sha256(f"{group.cursor_seq}\0{holder}".encode()).hexdigest()[:16]
    return store_once(
        db,
        group.chat_jid,
        notice_id=f"volume-wait-{key}",
        content=(
            f"⏳ This group's workspace is still mounted by {holder}. The run starts as soon as "
            "that host lets go of it (at once when it sees the group moved, or once it is known to be gone)."
        ),
        at=datetime.now(UTC),
        metadata={"volume_wait": {"holder": holder}},
    )


def _remove_containers_of(pool: WarmPool, folder: str, host: str) -> None:
    """The containers ``host`` (gone, of this machine and so of this engine) left for the group:
    they fenced themselves when it stopped beating; any still there is removed before this
    host uses the workspace they shared."""
    for container in pool.find(folder, any_host=True):
        if container.labels.get(LABEL_HOST) == host:
            log.warning("removing container %s that gone host %s left for %s", container.name, host, folder)
            pool.discard(container)
