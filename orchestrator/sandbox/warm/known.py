"""The warm container a process last handed a group's run to, reached again with no Docker call.

Per process: (data dir, host id, group folder) -> the group's warm container as this
process last reached it.  The next run of the group reaches it with no Docker API call
(:meth:`KnownContainers.reach`); anything that could make it wrong sends the run back to
Docker: another configuration, a run cut off on it, a socket that refuses or is not the
same one, and a rebuilt image: the host heartbeat's tending removes the idle containers of
an image their tag no longer names (``WarmPool.tend``), and a process looks the tag up
again at least every :data:`KNOWN_TTL_S` (one without a heartbeat, a group it serves
without a pause).
"""

from __future__ import annotations

import contextlib
import logging
import socket
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from docker.models.containers import Container

from orchestrator.core.errors import HostileEntry
from orchestrator.core.settings import Settings
from orchestrator.sandbox.containers import ContainerSpec
from orchestrator.sandbox.hostile_fs import SocketIdentity, connect_unix_named
from orchestrator.sandbox.standby import StandbyPool
from orchestrator.sandbox.warm.records import Records
from orchestrator.sandbox.warm.sockets import socket_of

log = logging.getLogger(__name__)

KNOWN_TTL_S = 300.0


@dataclass
class Known:
    """What this process knows of the warm container it last handed a group's run to:
    the container as Docker last described it, the configuration it serves (computed
    with ``image``, the image id looked up at ``looked_up``, monotonic) and the socket
    its runner listens on (:data:`~orchestrator.sandbox.hostile_fs.SocketIdentity`)."""

    container: Container
    config: str
    image: str
    looked_up: float
    socket: SocketIdentity

    @property
    def stale(self) -> bool:
        """Its image was looked up too long ago to trust (a rebuilt tag: :data:`KNOWN_TTL_S`)."""
        return time.monotonic() - self.looked_up > KNOWN_TTL_S


_known: dict[tuple[str, str, str], Known] = {}


def forget(container_id: object) -> None:
    """No group's run goes to container ``container_id`` without asking Docker (it is removed)."""
    for key, known in list(_known.items()):
        if known.container.id == container_id:
            _known.pop(key, None)


class KnownContainers:
    """This process's memory of the groups' warm containers, for this installation and host."""

    def __init__(self, settings: Settings, records: Records, standby: StandbyPool) -> None:
        self.settings = settings
        self.records = records
        self.standby = standby

    def _key(self, folder: str) -> tuple[str, str, str]:
        return (str(self.settings.data_dir), self.settings.fleet.effective_host_id, folder)

    def remember(self, folder: str, known: Known) -> None:
        _known[self._key(folder)] = known

    def expected(self, folder: str) -> str | None:
        """The warm container this process last handed the group's run to, if it still
        counts it as known (:meth:`reach` checks it when the run starts)."""
        known = _known.get(self._key(folder))
        if known is None or known.stale:
            return None
        return str(known.container.id)

    def reach(self, spec: ContainerSpec, config: Callable[[str], str]) -> tuple[Container, socket.socket, Path] | None:
        """The container this process last handed the group's run to, marked in use, a
        connection to its runner and its dirty marker, when it is still the one, with no
        Docker API call; None: ask Docker (``WarmPool.start``).  ``config``: the
        configuration the run needs with an image id.

        Still the one: the same configuration (its image looked up at most
        :data:`KNOWN_TTL_S` ago), no run cut off on it (its dirty marker, as
        ``Making.claim`` checks), and its runner's socket the very one reached last time
        (device, inode and change time, read from the descriptor the connection goes
        through): a new runner binds a new socket, and a dead one's refuses.  A host-side
        check of the file system the host already shares with the container, so it holds
        under gVisor as under runc (no look into the container's processes)."""
        key = self._key(spec.group_folder)
        known = _known.pop(key, None)  # put back once the run is handed over
        if known is None:
            return None
        if known.stale or config(known.image) != known.config:
            return None
        container = known.container
        dirty = self.records.dirty(spec.group_folder, str(container.id))
        with self.records.lock():
            if dirty.exists():
                return None  # a run on it was cut off: Docker's path replaces it
            self.records.mark_in_use(spec.group_folder, str(container.id))
        folder, relative = socket_of(self.standby, container, spec)
        try:
            sock, _ = connect_unix_named(folder, relative, expect=known.socket)
        except (OSError, HostileEntry) as exc:
            # Gone, or another runner listens there now: no run was handed to it, so it is
            # not in use; Docker's path finds out what is there.
            log.info("warm container %s did not answer as before (%s); asking Docker", container.name, exc)
            with contextlib.suppress(FileNotFoundError):
                dirty.unlink()
            return None
        _known[key] = known
        return container, sock, dirty
