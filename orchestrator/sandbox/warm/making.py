"""A group's warm container had for a run: its own claimed, a standby one adopted, or a new one made.

Each is marked in use (the dirty marker) before anything else can see it, under the
host's lock where another process could choose it to stop: a container being claimed
is never stopped as idle.  A claimed container serves exactly the run's configuration
and was cleaned up after its last run; any other of the group's is removed.  A standby
container is taken only by a group that would get exactly such a container
(``standby.eligible``), and gets the group's folders bound into it (``late_mounts``).
"""

from __future__ import annotations

import logging

import docker
from docker.errors import DockerException
from docker.models.containers import Container

from orchestrator.core.errors import SandboxError
from orchestrator.core.settings import Settings
from orchestrator.sandbox.containers import ContainerSpec, prepare_folder
from orchestrator.sandbox.hostile_fs import remove_entry
from orchestrator.sandbox.standby import Slot, StandbyPool
from orchestrator.sandbox.standby import eligible as standby_eligible
from orchestrator.sandbox.standby import unavailable_reason as standby_unavailable
from orchestrator.sandbox.warm.configuration import LABEL_WARM_CONFIG, RUNNER_SOCKET, create_args_here
from orchestrator.sandbox.warm.inventory import Inventory
from orchestrator.sandbox.warm.records import Adoption, Records, gateway_dir, host_only_dir

log = logging.getLogger(__name__)


class Making:
    """Claims, adopts and creates the groups' warm containers of this host."""

    def __init__(
        self,
        settings: Settings,
        client: docker.DockerClient,
        standby: StandbyPool,
        inventory: Inventory,
        records: Records,
    ) -> None:
        self.settings = settings
        self.client = client
        self.standby = standby
        self.inventory = inventory
        self.records = records

    def claim(self, spec: ContainerSpec, config: str) -> Container | None:
        """The group's running warm container of this configuration, marked in use;
        any other of the group's (stopped, stale, or never cleaned up after a run)
        is removed.  Call with the lock held."""
        claimed = None
        for c in self.inventory.find(spec.group_folder):
            if claimed is None and c.status == "running" and self.inventory.config_of(c, spec.group_folder) == config:
                if not self.records.dirty(spec.group_folder, str(c.id)).exists():
                    claimed = c
                    continue
                # A run on it never finished cleanly (a worker died mid-run):
                # what that run started may still be running. Never reuse it.
                log.info("warm container %s was not cleaned up after its last run; replacing it", c.name)
            else:
                log.info("replacing warm container %s (%s)", c.name, c.status)
            self.inventory.discard(c)
        if claimed is not None:
            self.records.mark_in_use(spec.group_folder, str(claimed.id))
        return claimed

    def create(self, spec: ContainerSpec, config: str, idle: float) -> Container:
        """A new warm container for the group, started and marked in use."""
        # Created here, not by Docker (which would make it root's and unwritable).
        spec.workspace.mkdir(parents=True, exist_ok=True)
        prepare_folder(spec.workspace)  # the user it runs as: container_user()
        # Whatever an agent left where the new runner will bind (a symlink, a
        # folder): gone before the container starts, so the first connection
        # can only reach the new runner's socket.
        remove_entry(spec.workspace, RUNNER_SOCKET)
        host_only_dir(gateway_dir(self.settings, spec.group_folder))
        # The very arguments its configuration was computed from.
        args = create_args_here(self.settings, self.client, spec, idle)
        args["labels"][LABEL_WARM_CONFIG] = config
        try:
            container = self.client.containers.create(**args)
        except DockerException as exc:
            raise SandboxError(f"cannot create a warm agent container: {exc}") from exc
        # In use before it runs: another process making room never takes it for idle.
        self.records.mark_in_use(spec.group_folder, str(container.id))
        try:
            container.start()
            container.reload()
        except DockerException as exc:
            self.inventory.discard(container)
            raise SandboxError(f"cannot start a warm agent container: {exc}") from exc
        return container

    def take_standby(self, spec: ContainerSpec, config: str) -> tuple[Container, Slot] | None:
        """A standby container for the group, recorded as its warm container and
        marked in use, or None (none ready, standby off, or the group needs other
        limits or mounts than a standby has).  Call with the lock held."""
        if standby_unavailable(self.settings, self.client) is not None or not standby_eligible(self.settings, spec):
            return None
        try:
            taken = self.standby.take(spec.group_folder)
        except DockerException as exc:
            log.warning("could not list the standby sandboxes: %s", exc)
            return None
        if taken is None:
            return None
        container, slot = taken
        record = Adoption(container=str(container.id), slot=slot.name, config=config)
        self.records.record_adoption(spec.group_folder, record)
        self.records.mark_in_use(spec.group_folder, str(container.id))
        return taken

    def attach(self, spec: ContainerSpec, container: Container, slot: Slot) -> None:
        """The group's folders into the standby container it took: the workspace
        (handed to the container's user, as for any container) and its gateway folder."""
        spec.workspace.mkdir(parents=True, exist_ok=True)
        prepare_folder(spec.workspace)
        gateway = host_only_dir(gateway_dir(self.settings, spec.group_folder))
        self.standby.attach(container, slot, spec.workspace, gateway)
