"""A host that cannot reach the database fences itself, on its own clock.

Another host takes a silent host's groups once its last heartbeat is
:data:`~orchestrator.store.hosts.ALIVE_WINDOW_S` old by the database's clock.  A host
cut off from the database (a partition, a stalled network) cannot ask whether that has
happened, so it counts for itself: :class:`SelfFence` watches the time since its last
successful beat on this machine's monotonic clock and, past :data:`FENCE_AFTER_S`, runs
the host's fence once (``sandbox/fencing.py``: its sandboxes stopped, its volumes
unmounted), inside the window and before any other host may take over.  The deliberate
exception to "leases use the database's clock" (docs/fleet.md): the one clock a cut-off
host has is its own, and a beat it could not send is one the database did not get.

A beat that succeeds again ends the outage; a later one fences again.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable

log = logging.getLogger(__name__)

# Seconds from the last successful beat: past the lease guard's (4.5 s, which stops the
# host's running sandboxes) and 3 s inside the liveness window (9 s), the time the fence
# has to stop containers and unmount before another host may take the groups.
FENCE_AFTER_S = 6.0
# How often the watch looks.
WATCH_EVERY_S = 0.25


class SelfFence:
    """Runs ``fence`` (given the seconds since the last beat) once per outage longer than
    ``after_s``; :meth:`beat_ok` after every beat that reached the database."""

    def __init__(
        self, fence: Callable[[float], object], *, after_s: float = FENCE_AFTER_S, name: str = "self-fence"
    ) -> None:
        self.fence, self.after_s = fence, after_s
        self._last_ok = time.monotonic()
        self._fenced = False
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._watch, name=name, daemon=True)

    def start(self) -> SelfFence:
        self._last_ok = time.monotonic()
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(timeout=5)

    def beat_ok(self) -> None:
        self._last_ok = time.monotonic()
        if self._fenced:
            log.warning("the database answers again: this host takes runs again")
        self._fenced = False

    @property
    def fenced(self) -> bool:
        return self._fenced

    def _watch(self) -> None:
        while not self._stop.wait(WATCH_EVERY_S):
            silent = time.monotonic() - self._last_ok
            if self._fenced or silent <= self.after_s:
                continue
            self._fenced = True
            log.warning("no heartbeat reached the database for %.1fs: this host fences itself", silent)
            try:
                self.fence(silent)
            except Exception:  # the fence is best effort; the storage's own fence remains
                log.exception("the self-fence failed")
