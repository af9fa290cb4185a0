"""Daemon threads kept for reuse by a run's helpers.

Every run starts five helpers: the lease's renewal and its guard
(``store/leases.py``), the stop watch (``run/stop_watch.py``), the sandbox's
keep-alive beat and its watchdog (``sandbox/containers.py``).  A new thread's
``start()`` waits until the system has scheduled it, on the run's path: about
0.1 ms each on a quiet 2-core machine and milliseconds on a loaded one
(docs/performance.md, "A warm run without Docker").  Here a helper is handed
to a thread that waits for work: a queue put, no wait.

Not ``concurrent.futures.ThreadPoolExecutor``: its threads are joined when
the interpreter exits, and a helper may hang in a read on a database that is
away (the lease's renewal, the stop watch's poll); these are daemons, as the
threads they replace were.  A thread idle for :data:`IDLE_S` ends, so a burst
leaves nothing behind; a forked child (Celery's prefork pool) starts with
none, since the parent's threads do not exist there.
"""

from __future__ import annotations

import logging
import os
import queue
import threading
from collections.abc import Callable

log = logging.getLogger(__name__)

# A spare thread that had no work for this long ends.
IDLE_S = 60.0
_NAME = "spare"


class Job:
    """One helper's run on a spare thread: :meth:`join` waits for its end."""

    def __init__(self, target: Callable[[], object], name: str) -> None:
        self.target, self.name = target, name
        self._done = threading.Event()

    def join(self, timeout: float | None = None) -> None:
        self._done.wait(timeout)

    def is_alive(self) -> bool:
        return not self._done.is_set()

    def _run(self) -> None:
        me = threading.current_thread()
        me.name = self.name  # as the thread it replaces was named (logs, py-spy)
        try:
            self.target()
        except Exception:  # as an uncaught exception in a thread of its own: logged
            log.exception("thread %s failed", self.name)
        finally:
            me.name = _NAME


class Timer:
    """Calls a function after a delay unless cancelled first (``threading.Timer``'s surface)."""

    def __init__(self, pool: SpareThreads, seconds: float, call: Callable[[], object], name: str) -> None:
        self._cancelled = threading.Event()

        def wait_then_call() -> None:
            if not self._cancelled.wait(seconds):
                call()

        self.job = pool.start(wait_then_call, name)

    def cancel(self) -> None:
        self._cancelled.set()


class SpareThreads:
    """Threads that wait for work; :meth:`start` hands a function to one (a new one if none waits)."""

    def __init__(self, idle_s: float = IDLE_S) -> None:
        self.idle_s = idle_s
        self._lock = threading.Lock()
        self._idle: list[queue.SimpleQueue[Job]] = []
        os.register_at_fork(after_in_child=self._forget)

    def start(self, target: Callable[[], object], name: str) -> Job:
        job = Job(target, name)
        with self._lock:
            inbox = self._idle.pop() if self._idle else None
        if inbox is None:
            inbox = queue.SimpleQueue()
            threading.Thread(target=self._serve, args=(inbox,), name=_NAME, daemon=True).start()
        inbox.put(job)
        return job

    def after(self, seconds: float, call: Callable[[], object], name: str) -> Timer:
        """``call`` in ``seconds`` on a spare thread, unless the timer is cancelled first."""
        return Timer(self, seconds, call, name)

    def idle(self) -> int:
        with self._lock:
            return len(self._idle)

    def _serve(self, inbox: queue.SimpleQueue[Job]) -> None:
        while True:
            try:
                job = inbox.get(timeout=self.idle_s)
            except queue.Empty:
                with self._lock:
                    if inbox in self._idle:  # nobody took this thread meanwhile: it ends
                        self._idle.remove(inbox)
                        return
                continue  # taken as the wait ran out: its job is on its way
            job._run()
            with self._lock:
                self._idle.append(inbox)
            # Ended after the thread is back among the idle: a helper started right after a
            # join finds it there.
            job._done.set()

    def _forget(self) -> None:
        # In a forked child: the parent's threads are not here, and the lock may be held.
        self._lock = threading.Lock()
        self._idle = []


# The process's spare threads (a forked child gets its own).
SPARE = SpareThreads()
