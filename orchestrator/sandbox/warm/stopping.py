"""Stopping warm containers on purpose: a group reset, a worker that stops, a host cut off.

A warm container is a cache: the next run starts one.  So stopping one loses nothing
but a start, except while a run is on it; what each caller may stop differs:

* ``orchestrator groups reset``, and a group's workspace volume made or grown (``quota``):
  the group's, on every host;
* a worker that stops: its host's idle ones and its standby ones, so a stopped
  installation (``up`` ended, ``compose down``) leaves no agent container behind;
* a host cut off from the database (``fencing.fence_cut_off``): all of its own, busy or
  not, since none of its runs can be answered for.
"""

from __future__ import annotations

import docker

from orchestrator.core.settings import Settings
from orchestrator.sandbox.containers import LABEL_GROUP, LABEL_INSTALL, LABEL_MANAGED, list_containers
from orchestrator.sandbox.warm.inventory import Inventory


class Stopping:
    """Stops this installation's warm containers on this engine."""

    def __init__(self, settings: Settings, client: docker.DockerClient, inventory: Inventory) -> None:
        self.settings = settings
        self.client = client
        self.inventory = inventory

    def stop(self, folder: str) -> int:
        """Stop and remove a group's warm container(s), whichever host's on this engine; returns how many."""
        found = self.inventory.find(folder, any_host=True)
        for c in found:
            self.inventory.discard(c)
        return len(found)

    def stop_all(self) -> int:
        found = self.inventory.listed(any_host=True)
        for c in found:
            self.inventory.discard(c)
        return len(found) + self.inventory.standby.stop_all()

    def stop_host(self) -> int:
        """Remove every warm container of this host, busy or not (the host is cut off: none of
        its runs can be answered for); returns how many."""
        found = self.inventory.listed()
        for c in found:
            self.inventory.discard(c)
        return len(found)

    def group_running(self, folder: str) -> bool:
        """Whether a container of this installation (warm or cold, any host's) runs for the
        group on this engine."""
        labels = [f"{LABEL_MANAGED}=1", f"{LABEL_INSTALL}={self.settings.install_id}", f"{LABEL_GROUP}={folder}"]
        return bool(list_containers(self.client, filters={"label": labels, "status": "running"}, sparse=True))

    def stop_idle(self) -> int:
        """Stop this host's warm containers that have no run on them, and its standby
        ones: what the host's worker does as it stops, so a stopped installation
        (`up` ended, `compose down`) leaves no agent container behind.  A warm
        container is a cache: the next run starts one.  Returns how many."""
        with self.inventory.records.lock():
            idle = [c for c in self.inventory.listed() if not self.inventory.busy(c)]
            for c in idle:
                self.inventory.discard(c)
        return len(idle)
