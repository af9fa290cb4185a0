"""The host heartbeat's tending of its warm containers, every beat.

* a group placed on another host (``orchestrator/store/placement.py``: moved, or taken
  over while this host was away): this host stops its warm container, once no run of
  this host is on it;
* a container of an image its tag no longer names (rebuilt since it started) goes once
  idle, so no run is handed to an old image;
* past the cap (``sizing.warm_cap``), the least recently used idle ones go;
* the standby pool is kept full;
* the warm and standby containers on this engine of hosts that stopped beating go too
  (a worker SIGKILLed for good leaves them running, and nobody else tends them).

A container carries its host's id (:data:`LABEL_HOST`) and a host tends only its own:
hosts may share a Docker engine.
"""

from __future__ import annotations

import contextlib
import logging
import time

import docker
from docker.errors import DockerException
from docker.models.containers import Container

from orchestrator.core.errors import ImageBuildError, SandboxError
from orchestrator.core.settings import Settings
from orchestrator.sandbox.containers import LABEL_INSTALL, LABEL_MANAGED, labels_of, list_containers, name_of
from orchestrator.sandbox.image import VARIANTS, image_name
from orchestrator.sandbox.standby import standby_key
from orchestrator.sandbox.standby import unavailable_reason as standby_unavailable
from orchestrator.sandbox.warm.configuration import LABEL_HOST
from orchestrator.sandbox.warm.inventory import Inventory
from orchestrator.sandbox.warm.sizing import make_room, warm_cap
from orchestrator.store.db import Database
from orchestrator.store.hosts import gone_for
from orchestrator.store.placement import moved_away

log = logging.getLogger(__name__)

# How often one process looks for dead hosts' containers on its engine (Tending.tend,
# every host heartbeat beat, calls it): host id -> when it last looked (monotonic).
REAP_EVERY_S = 15.0
_reaped_at: dict[str, float] = {}


class Tending:
    """What this host's heartbeat does to its warm and standby containers."""

    def __init__(self, settings: Settings, client: docker.DockerClient, inventory: Inventory) -> None:
        self.settings = settings
        self.client = client
        self.inventory = inventory

    @property
    def host_id(self) -> str:
        return self.settings.fleet.effective_host_id

    def tend(self, db: Database) -> int:
        """Stop this host's warm containers of groups placed on another host now
        (``store/placement.py``: moved, or taken over while this host was away) whose
        lease no process of this host holds and that no run of ours is using, and the
        least recently used idle ones past the cap (a lowered ``ORCHESTRATOR_WARM_MAX``,
        or more started at once than the cap while all were busy); then keep the
        standby pool full.  Returns how many of this host's warm containers run after
        that.  The host heartbeat's counting thread calls it every beat, so a group
        that moved leaves no idle container behind on its old host; one Docker list,
        and a database read only when there are warm containers."""
        inventory = self.inventory
        self.remove_dead_hosts_containers(db)
        running = inventory.running()
        folders = sorted({inventory.folder_of(c) or "" for c in running} - {""})
        gone = set(moved_away(db, self.host_id, folders))
        stopped = 0
        left = []
        for c in running:
            folder = inventory.folder_of(c) or ""
            if folder not in gone or inventory.busy(c):
                left.append(c)
                continue  # still placed here, or a run of this host is on it right now
            log.info(
                "group folder %s is placed on another host now: stopping its warm container %s here", folder, name_of(c)
            )
            inventory.discard(c)
            stopped += 1
        stale = self._of_old_images(left)
        if stale:
            with inventory.records.lock():
                for c in stale:
                    if inventory.busy(c):
                        continue  # stopped at a later beat, once its run is over
                    log.info("stopping warm container %s: its image was rebuilt since it started", name_of(c))
                    inventory.discard(c)
                    left.remove(c)
                    stopped += 1
        if len(left) > warm_cap(self.settings.sandbox):
            with inventory.records.lock():
                stopped += make_room(inventory, warm_cap(self.settings.sandbox), left)
        if standby_unavailable(self.settings, self.client) is None:
            try:
                with inventory.records.lock():
                    missing = inventory.standby.prune(self.settings.sandbox.standby)
                # Started without the lock: a claim never waits for a container start.
                for _ in range(missing):
                    inventory.standby.start(standby_key(self.client, self.settings))
            except (SandboxError, DockerException, OSError) as exc:
                log.warning("could not refill the standby sandboxes: %s", exc)
        return len(running) - stopped

    def _of_old_images(self, running: list[Container]) -> list[Container]:
        """Those of ``running`` (listed sparse) whose image is not what the agent image's
        tag, or a variant's, names now (rebuilt since they started).  None when no tag
        can be read (an engine that does not answer says nothing of the kind)."""
        if not running:
            return []
        current = set()
        for variant in (None, *VARIANTS):
            with contextlib.suppress(DockerException, ImageBuildError):
                current.add(str(self.client.images.get(image_name(self.settings, variant)).id))
        if not current:
            return []
        return [c for c in running if c.attrs.get("ImageID") not in (None, *current)]

    def remove_dead_hosts_containers(self, db: Database) -> int:
        """Remove the warm and standby containers on this engine of hosts that have not
        beaten for ``ORCHESTRATOR_DEAD_HOST_S`` (a worker SIGKILLed for good
        leaves them running: its groups moved, and nobody else tends them).  Looked at at
        most every :data:`REAP_EVERY_S` per process: one Docker list, and a database read
        only when another host's containers are there.  Returns how many were removed."""
        after = self.settings.fleet.dead_host_s
        now = time.monotonic()
        if after <= 0 or now - _reaped_at.get(self.host_id, -REAP_EVERY_S) < REAP_EVERY_S:
            return 0
        _reaped_at[self.host_id] = now
        labels = [f"{LABEL_MANAGED}=1", f"{LABEL_INSTALL}={self.settings.install_id}", LABEL_HOST]
        foreign = [
            c
            for c in list_containers(self.client, all=True, filters={"label": labels}, sparse=True)
            if labels_of(c).get(LABEL_HOST) not in (None, self.host_id)
        ]
        gone = gone_for(db, {labels_of(c)[LABEL_HOST] for c in foreign}, after)
        removed = 0
        for c in foreign:
            host = labels_of(c)[LABEL_HOST]
            if host in gone:
                log.warning(
                    "removing container %s of host %s, which has not beaten for %.0fs or more", name_of(c), host, after
                )
                self.inventory.discard(c)
                removed += 1
        return removed
