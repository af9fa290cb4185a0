"""Which warm containers there are, found on the engine by their labels, and their removal.

A warm container carries the installation's labels, ``orchestrator.warm``, its host's
id (:data:`LABEL_HOST`) and its group's folder; a standby container a group took
carries none of the group's, so it is found through the group's adoption record
(``records.Adoption``) and its slot.  Nothing is held by a process: any worker
process of the host finds the same containers.
"""

from __future__ import annotations

import contextlib

import docker
from docker.errors import DockerException, NotFound
from docker.models.containers import Container

from orchestrator.core.settings import Settings
from orchestrator.sandbox.containers import (
    LABEL_GROUP,
    LABEL_INSTALL,
    LABEL_MANAGED,
    LABEL_WARM,
    labels_of,
    list_containers,
)
from orchestrator.sandbox.standby import LABEL_STANDBY, Slot, StandbyPool, standby_root
from orchestrator.sandbox.warm.configuration import LABEL_HOST, LABEL_WARM_CONFIG
from orchestrator.sandbox.warm.known import forget as forget_known
from orchestrator.sandbox.warm.records import Records


class Inventory:
    """This installation's warm containers on this engine, this host's by default."""

    def __init__(self, settings: Settings, client: docker.DockerClient, standby: StandbyPool, records: Records) -> None:
        self.settings = settings
        self.client = client
        self.standby = standby
        self.records = records

    @property
    def host_id(self) -> str:
        return self.settings.fleet.effective_host_id

    def labels(self, folder: str | None = None, *, any_host: bool = False) -> list[str]:
        labels = [f"{LABEL_MANAGED}=1", f"{LABEL_INSTALL}={self.settings.install_id}", f"{LABEL_WARM}=1"]
        if not any_host:
            labels.append(f"{LABEL_HOST}={self.host_id}")
        return labels + ([f"{LABEL_GROUP}={folder}"] if folder is not None else [])

    def listed(self, *, any_host: bool = False) -> list[Container]:
        """Every warm container (standby ones too, taken or not) of this host, or of every host."""
        return list_containers(self.client, all=True, filters={"label": self.labels(any_host=any_host)})

    def folder_of(self, container: Container) -> str | None:
        """The group a warm container serves: its label, or for a standby one the
        group that took it (None: a standby still in the pool)."""
        labels = labels_of(container)
        if labels.get(LABEL_STANDBY):
            slot = self.standby.slot_of(container)
            return slot.taken_by() if slot is not None else None
        return labels.get(LABEL_GROUP) or None

    def find(self, folder: str, *, any_host: bool = False) -> list[Container]:
        """The group's warm containers of this host (``any_host``: of every host on this
        engine): those started for it, and the standby container it took, if any."""
        found = list_containers(self.client, all=True, filters={"label": self.labels(folder, any_host=any_host)})
        adoption = self.records.adoption(folder)
        if adoption is not None:
            try:
                c = self.client.containers.get(adoption.container)
            except (NotFound, DockerException):
                c = None
            if c is None or c.status not in ("created", "running"):
                # Gone (idle exit, auto-removed): its slot and the record go too.
                self.standby.release(Slot(standby_root(self.settings) / adoption.slot))
                self.records.forget_adoption(folder)
            elif (
                c.labels.get(LABEL_STANDBY) == adoption.slot
                and c.labels.get(LABEL_INSTALL) == self.settings.install_id
                and (any_host or c.labels.get(LABEL_HOST) == self.host_id)
            ):
                found.append(c)
        return found

    def config_of(self, container: Container, folder: str) -> str | None:
        """The warm configuration ``container`` serves (for a standby one, the one its
        group's adoption recorded)."""
        if container.labels.get(LABEL_STANDBY):
            adoption = self.records.adoption(folder)
            return adoption.config if adoption is not None and adoption.container == container.id else None
        return container.labels.get(LABEL_WARM_CONFIG)

    def running(self) -> list[Container]:
        """This host's running warm containers that serve a group (standby ones still
        in the pool are not warm containers yet)."""
        # Sparse: one request however many there are (the heartbeat asks every beat).
        running = list_containers(self.client, filters={"label": self.labels(), "status": "running"}, sparse=True)
        return [c for c in running if self.folder_of(c) is not None]

    def busy(self, container: Container) -> bool:
        """A run is on it (its dirty marker)."""
        return self.records.dirty(self.folder_of(container) or "", str(container.id)).exists()

    def last_used(self, container: Container) -> float:
        return self.records.last_used(self.folder_of(container) or "", str(container.id))

    def discard(self, container: Container) -> None:
        """Remove a warm container and forget its run marker (and, for a standby
        one, release its slot and the group's record of it)."""
        folder = self.folder_of(container)
        forget_known(container.id)
        with contextlib.suppress(NotFound, DockerException):
            container.remove(force=True)
        if folder:
            self.records.forget_markers(folder, str(container.id))
        slot = self.standby.slot_of(container)
        if slot is not None:
            self.standby.release(slot)
            adoption = self.records.adoption(folder) if folder else None
            if folder and adoption is not None and adoption.container == container.id:
                self.records.forget_adoption(folder)
