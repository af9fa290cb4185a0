"""``WarmPool``: the warm containers of this installation, as the pipeline's sandbox.

A run goes first to the container this process last handed the group's run to, with
no Docker call (:mod:`.known`); else, under the host's lock, to the group's own
container of the run's configuration (:mod:`.making`), to a standby container the group
adopts, or to a new one, after room was made under the cap (:mod:`.sizing`).  A
container that does not answer is replaced, transparently, once.  The pool's other
duties are its collaborators': which containers there are (:mod:`.inventory`), the
heartbeat's tending (:mod:`.tending`) and stopping them on purpose (:mod:`.stopping`).
"""

from __future__ import annotations

import logging
import time

import docker
from docker.models.containers import Container

from orchestrator.core.errors import HostileEntry, SandboxError
from orchestrator.core.settings import Settings
from orchestrator.sandbox.containers import ContainerSpec, image_id
from orchestrator.sandbox.standby import Slot, StandbyPool
from orchestrator.sandbox.warm.configuration import LABEL_HOST, config_here
from orchestrator.sandbox.warm.inventory import Inventory
from orchestrator.sandbox.warm.known import Known, KnownContainers
from orchestrator.sandbox.warm.making import Making
from orchestrator.sandbox.warm.records import Records
from orchestrator.sandbox.warm.run import StartMode, WarmRun
from orchestrator.sandbox.warm.sizing import make_room, warm_cap
from orchestrator.sandbox.warm.sockets import STARTUP_TIMEOUT_S, connect_runner, socket_of
from orchestrator.sandbox.warm.stopping import Stopping
from orchestrator.sandbox.warm.tending import Tending
from orchestrator.store.db import Database

log = logging.getLogger(__name__)

# The containers a run tries before it fails: one that does not answer is replaced.
CONNECT_ATTEMPTS = 2


class WarmPool:
    """Finds, starts and replaces the warm containers of this installation."""

    def __init__(self, settings: Settings, client: docker.DockerClient) -> None:
        self.settings = settings
        self.client = client
        self.standby = StandbyPool(settings, client, self.host_id, LABEL_HOST)
        self.records = Records(settings)
        self.inventory = Inventory(settings, client, self.standby, self.records)
        self.known = KnownContainers(settings, self.records, self.standby)
        self.making = Making(settings, client, self.standby, self.inventory, self.records)
        self.tending = Tending(settings, client, self.inventory)
        self.stopping = Stopping(settings, client, self.inventory)

    @property
    def host_id(self) -> str:
        return self.settings.fleet.effective_host_id

    def find(self, folder: str, *, any_host: bool = False) -> list[Container]:
        """The group's warm containers of this host (``any_host``: of every host on this engine)."""
        return self.inventory.find(folder, any_host=any_host)

    def discard(self, container: Container) -> None:
        """Remove a warm container and what the host remembers of it."""
        self.inventory.discard(container)

    def stop(self, folder: str) -> int:
        return self.stopping.stop(folder)

    def stop_all(self) -> int:
        return self.stopping.stop_all()

    def stop_host(self) -> int:
        return self.stopping.stop_host()

    def group_running(self, folder: str) -> bool:
        return self.stopping.group_running(folder)

    def stop_idle(self) -> int:
        return self.stopping.stop_idle()

    def count_running(self) -> int:
        """This host's running warm containers of this installation (the host's heartbeat reports it)."""
        return len(self.inventory.running())

    def tend(self, db: Database) -> int:
        return self.tending.tend(db)

    def remove_dead_hosts_containers(self, db: Database) -> int:
        return self.tending.remove_dead_hosts_containers(db)

    def expected_container(self, group_folder: str) -> str | None:
        """The warm container this process last handed the group's run to, if it still
        counts it as known (checked when the run starts)."""
        return self.known.expected(group_folder)

    def start(self, spec: ContainerSpec, payload: bytes) -> WarmRun:
        """The run of ``spec`` (its input line ``payload``) handed to the group's warm
        container: the known one, else its own, a standby one or a new one (the module's docs)."""
        idle = self.settings.sandbox.warm_idle_s
        reached = self.known.reach(spec, lambda image: config_here(self.settings, self.client, image, spec, idle))
        if reached is not None:
            known, sock, dirty = reached
            return WarmRun(known, sock, spec, payload, start_mode="warm", dirty_marker=dirty, discard=self.discard)
        image, looked_up = image_id(self.client, spec.image), time.monotonic()
        config = config_here(self.settings, self.client, image, spec, idle)
        last_error: Exception | None = None
        for _ in range(CONNECT_ATTEMPTS):
            taken: tuple[Container, Slot] | None = None
            with self.records.lock():
                container = self.making.claim(spec, config)
                if container is None:
                    # Room for the new one first: the cap counts it.
                    make_room(self.inventory, warm_cap(self.settings.sandbox) - 1, self.inventory.running())
                    taken = self.making.take_standby(spec, config)
            mode: StartMode = "warm" if container is not None else "standby"
            if taken is not None:
                container, slot = taken
                try:
                    self.making.attach(spec, container, slot)
                except (OSError, SandboxError) as exc:
                    log.warning(
                        "could not bind %s into standby container %s (%s); starting one for it",
                        spec.group_folder,
                        container.name,
                        exc,
                    )
                    self.discard(container)
                    container = None
            if container is None:
                container = self.making.create(spec, config, idle)
                mode = "cold"
            dirty = self.records.dirty(spec.group_folder, str(container.id))
            try:
                folder, relative = socket_of(self.standby, container, spec)
                sock, socket_id = connect_runner(folder, relative, retry_s=0.0 if mode == "warm" else STARTUP_TIMEOUT_S)
            except (OSError, HostileEntry) as exc:
                # Died between runs (or mid-idle-exit), or its socket is gone: replace it, transparently.
                log.info("warm container of %s did not answer (%s); replacing it", spec.group_folder, exc)
                last_error = exc
                self.discard(container)
                continue
            self.known.remember(spec.group_folder, Known(container, config, image, looked_up, socket_id))
            return WarmRun(container, sock, spec, payload, start_mode=mode, dirty_marker=dirty, discard=self.discard)
        raise SandboxError(f"cannot reach a warm agent container for {spec.group_folder}: {last_error}")
