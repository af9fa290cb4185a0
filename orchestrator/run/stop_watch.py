"""A run's stop-watch: what stops its container while it runs, besides its own end.

A cancel may come from any process on any host (the database says so), and
the group's lease may be lost (``store/leases.py``: another holder, or no
renewal for ``leases.UNSURE_AFTER_S``); either kills the run's container at
once, not at the run's next output.  Used by the run attempt
(``run/attempt.py``), for chat runs and replays alike.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable

from orchestrator.core.clock import SYSTEM_CLOCK, Clock
from orchestrator.core.spare_threads import SPARE
from orchestrator.store import leases
from orchestrator.store.db import Database
from orchestrator.store.runs import run_state

log = logging.getLogger(__name__)


class StopWatch:
    """Stops a run's container when the run is cancelled or the lease is lost.

    Polls the run's state once a second: a cancel may come from any process
    on any host, and the database is what they share.  A lost lease stops the
    container from the thread that finds it lost (``leases.LostSignal``: the
    heartbeat's guard), so a read that hangs on a database that is away never
    delays the stop; a plain Event is looked at with the poll.
    """

    def __init__(
        self,
        db: Database,
        run_id: str,
        stop: Callable[[], None],
        lease_lost: threading.Event | None,
        interval_s: float = 1.0,
        *,
        clock: Clock = SYSTEM_CLOCK,
    ) -> None:
        self._db, self._run_id, self._stop_fn = db, run_id, stop
        self._clock = clock
        self._lease_lost = lease_lost
        self._interval = interval_s
        self._done = threading.Event()
        self.reason: str | None = None
        self._stopping = threading.Lock()
        self._forget_lease: Callable[[], None] | None = None

    def __enter__(self) -> StopWatch:
        self._thread = SPARE.start(self._watch, f"stopwatch-{self._run_id[:8]}")
        if isinstance(self._lease_lost, leases.LostSignal):
            # Called by the thread that finds the lease lost (the heartbeat's guard), at once.
            self._forget_lease = self._lease_lost.on_set(lambda: self._stop("lease_lost"))
        return self

    def __exit__(self, *exc: object) -> None:
        self._done.set()
        if self._forget_lease is not None:
            self._forget_lease()
        # The cancel poll may hang in a read on a database that is away: not waited for long.
        self._thread.join(timeout=5)

    def _stop(self, reason: str) -> None:
        with self._stopping:
            if self.reason is None and not self._done.is_set():
                self.reason = reason
                self._stop_fn()

    def _watch(self) -> None:
        while not self._clock.wait(self._done, self._interval):
            if self.reason is not None:
                return
            if self._lease_lost is not None and self._lease_lost.is_set():
                self._stop("lease_lost")
                return
            try:
                if run_state(self._db, self._run_id) == "cancelled":
                    self._stop("cancelled")
                    return
            except Exception:  # a DB hiccup is not a cancel
                log.warning(
                    "run %s: could not read its state; looking again in %.0fs",
                    self._run_id,
                    self._interval,
                    exc_info=True,
                )
