"""Reaching a warm runner's socket.

The runner binds its socket in the group's workspace (``RUNNER_SOCKET``), or, in a
standby container, in its slot's socket folder.  Both are the agent's to write, so
the socket is reached as ``hostile_fs`` reaches anything there: no symlink followed,
a socket or nothing.
"""

from __future__ import annotations

import socket
import time
from pathlib import Path

from docker.models.containers import Container

from orchestrator.core.errors import HostileEntry
from orchestrator.sandbox.containers import ContainerSpec
from orchestrator.sandbox.hostile_fs import SocketIdentity, connect_unix_named
from orchestrator.sandbox.standby import SOCKET_NAME, StandbyPool
from orchestrator.sandbox.warm.configuration import RUNNER_SOCKET

# How long a fresh runner may take to listen.
STARTUP_TIMEOUT_S = 20.0


def socket_of(standby: StandbyPool, container: Container, spec: ContainerSpec) -> tuple[Path, str]:
    """Where the runner's socket is: in the workspace, or for a standby container in its
    slot's socket folder (both hostile: see :func:`connect_runner`)."""
    slot = standby.slot_of(container)
    if slot is not None:
        return slot.sockets, SOCKET_NAME
    return spec.workspace, RUNNER_SOCKET


def connect_runner(folder: Path, relative: str, *, retry_s: float) -> tuple[socket.socket, SocketIdentity]:
    """Connect to the warm runner's socket at ``relative`` in ``folder`` (the workspace,
    or a standby's socket folder).

    The socket lives in the agent's own workspace (so the agent cannot use it
    to fill any other disk than its quota'd one), which makes the entry
    hostile: it is reached with no symlink followed and only if it is a
    socket (``hostile_fs.connect_unix``).  ``retry_s``: a fresh runner may not
    listen yet (ECONNREFUSED, or no entry at all): keep trying that long.
    """
    deadline = time.monotonic() + retry_s
    while True:
        try:
            return connect_unix_named(folder, relative)
        except (ConnectionRefusedError, HostileEntry) as exc:
            if isinstance(exc, HostileEntry) and exc.reason != "no such file":
                raise
            if time.monotonic() > deadline:
                raise
            time.sleep(0.005)
