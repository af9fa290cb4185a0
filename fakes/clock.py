"""A clock that jumps: waits return at once and move the time on.

Implements ``orchestrator.core.clock.Clock``.  A wait that is not cut short by
its event advances the time by the whole wait after a tiny real pause (so a
polling thread neither spins nor sleeps), and is recorded with the name of
the thread that waited: a test reads the pipeline's backoff from
``waits_of("MainThread")`` instead of sleeping through it.
"""

from __future__ import annotations

import threading
from datetime import UTC, datetime, timedelta

_REAL_PAUSE_S = 0.005


class FakeClock:
    def __init__(self, start: datetime = datetime(2026, 11, 26, 12, 0, tzinfo=UTC)) -> None:
        self._now = start
        self._lock = threading.Lock()
        self.waits: list[tuple[str, float]] = []

    def now(self) -> datetime:
        with self._lock:
            return self._now

    def advance(self, seconds: float) -> None:
        with self._lock:
            self._now += timedelta(seconds=seconds)

    def wait(self, event: threading.Event, seconds: float) -> bool:
        with self._lock:
            self.waits.append((threading.current_thread().name, seconds))
        if event.wait(_REAL_PAUSE_S):
            return True
        self.advance(seconds)
        return event.is_set()

    def waits_of(self, thread_name: str) -> list[float]:
        with self._lock:
            return [s for name, s in self.waits if name == thread_name]
