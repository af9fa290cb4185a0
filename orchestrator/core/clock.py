"""Time, as one object the code is handed: wall time and waiting.

Lease heartbeats, the run's stop-watch and retry backoff ask a :class:`Clock`
instead of calling ``datetime.now`` or ``Event.wait`` themselves, so their
logic can be tested with a clock that jumps (``fakes/clock.py``) rather
than with sleeps.  :data:`SYSTEM_CLOCK` is the real one.

A clock paces waits and intervals; it decides no expiry that another host
compares: lease expiries and delivery claim deadlines are on the database's
clock (``orchestrator/store/db.py``: ``db_now``), whatever this host's says.
"""

from __future__ import annotations

import threading
from datetime import UTC, datetime
from typing import Protocol


class Clock(Protocol):
    def now(self) -> datetime:
        """The wall time, timezone-aware UTC."""
        ...

    def wait(self, event: threading.Event, seconds: float) -> bool:
        """Wait until ``event`` is set or ``seconds`` pass; True if it was set."""
        ...


class SystemClock:
    def now(self) -> datetime:
        return datetime.now(UTC)

    def wait(self, event: threading.Event, seconds: float) -> bool:
        return event.wait(seconds)


SYSTEM_CLOCK: Clock = SystemClock()
