"""How many warm containers a host keeps, and which go when there are too many.

An idle warm container may hold up to its memory limit (its /tmp is a tmpfs and its
page cache counts too), so a host keeps at most :func:`warm_cap` of them: the
``ORCHESTRATOR_WARM_MAX`` setting, else as many as fit in a share of the host's
memory.  Past the cap the least recently used idle ones are stopped
(:func:`make_room`); a container is "used" when a run is handed to it (a host-only
marker's mtime) and is never stopped while a run is on it.
"""

from __future__ import annotations

import logging
import os

from docker.models.containers import Container

from orchestrator.core.settings import SandboxSettings
from orchestrator.core.sizes import memory_bytes
from orchestrator.sandbox.containers import name_of
from orchestrator.sandbox.warm.inventory import Inventory

log = logging.getLogger(__name__)

# The cap sized by memory: an idle warm container may hold up to its memory
# limit (its /tmp is a tmpfs and its page cache counts too), so the cap lets
# them all together hold at most this share of the host's memory ...
WARM_MEMORY_SHARE = 0.5
# ... and never fewer than this (one per pool child of a small worker) nor more.
MIN_WARM, MAX_AUTO_WARM = 2, 256


def host_memory_bytes() -> int:
    """This machine's physical memory (a worker in a container sees its host's too:
    agent containers are its siblings on the host's engine)."""
    return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")


def warm_cap(sandbox: SandboxSettings, memory: int | None = None) -> int:
    """The most warm containers this host keeps: ``ORCHESTRATOR_WARM_MAX``, else as
    many as fit in ``WARM_MEMORY_SHARE`` of ``memory`` (the host's) at the
    installation's container memory limit."""
    if sandbox.warm_max:
        return sandbox.warm_max
    total = host_memory_bytes() if memory is None else memory
    fits = int(total * WARM_MEMORY_SHARE) // memory_bytes(sandbox.container_memory)
    return max(MIN_WARM, min(MAX_AUTO_WARM, fits))


def make_room(inventory: Inventory, keep: int, running: list[Container]) -> int:
    """Stop the least recently used idle containers of ``running`` (this host's)
    until at most ``keep`` are left; a container with a run on it is never
    stopped.  Call with the lock held.  Returns how many were stopped."""
    excess = len(running) - keep
    if excess <= 0:
        return 0
    victims = sorted((c for c in running if not inventory.busy(c)), key=inventory.last_used)[:excess]
    for c in victims:
        log.info("stopping warm container %s, the least recently used: this host keeps at most %d", name_of(c), keep)
        inventory.discard(c)
    return len(victims)
