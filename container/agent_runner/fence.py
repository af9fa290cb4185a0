"""The host's fence: a run stops when the host that handed it over is gone.

Why: killing a worker does not stop its container (Docker knows nothing of
Celery), and in a fleet another host takes the group over once the worker's
host misses its heartbeats, then starts its own container on the same shared
workspace.  A sandbox that outlived its worker would be a second writer in
that workspace.  So the runner watches its host, and the host is the one
thing it cannot fake: the stream the run came on (stdin of a one-shot
container, the connection of a warm run) stays open for the whole run and
carries a byte from the host at least every ``host_fence_s / 4`` seconds.
When the stream ends (the worker process died: the kernel closed its
sockets, and Docker closes the container's stdin with them) or falls silent
for ``host_fence_s`` (the worker is frozen or cut off), the runner kills every
process of the container and exits, before the dead-host window lets
another host in.

Once the run has emitted its final event, the host may hang up whenever it
likes: that is the run's normal end, not the host's death.

Not a defence against the agent (which shares the runner's uid and could
kill the runner itself, which ends its own container); the host still kills
and removes containers it can reach.
"""

from __future__ import annotations

import logging
import os
import queue
import select
import signal
import threading
from collections.abc import Callable

log = logging.getLogger("agent_runner")

EXIT_FENCED = 3


def stop_everything(why: str) -> None:
    """Kill every other process of the container and exit at once.

    The runner is PID 1 of the container's pid namespace: ``kill(-1)`` reaches
    every process it may signal there (all of them: the agent runs as the
    same user), and its own exit would end the rest anyway.  Never as
    anything but PID 1: outside a container, ``kill(-1)`` means every process
    of the user.
    """
    log.error("the host is gone (%s): stopping every process of this sandbox", why)
    for handler in logging.getLogger().handlers:
        handler.flush()
    if os.getpid() == 1:
        try:
            os.kill(-1, signal.SIGKILL)
        except OSError:
            pass
    os._exit(EXIT_FENCED)


# Threads that watched a run and wait for the next (a warm runner serves one run at a time:
# one thread, started once).  A watch handed to one starts without a thread start on the
# run's path, which waits for the new thread to be scheduled (0.3 ms of a warm run's first
# event here: docs/performance.md, "A warm run without Docker").
_Job = tuple[Callable[[], None], threading.Event]
_idle: list[queue.SimpleQueue[_Job]] = []
_idle_lock = threading.Lock()


def _serve_watches(inbox: queue.SimpleQueue[_Job]) -> None:
    while True:
        work, done = inbox.get()
        try:
            work()
        finally:
            with _idle_lock:
                _idle.append(inbox)
            done.set()  # after the thread is back: the next run's watch finds it waiting


def _on_a_thread(work: Callable[[], None]) -> threading.Event:
    """``work`` on a waiting thread (a new one if none waits); the event is set when it ends."""
    done = threading.Event()
    with _idle_lock:
        inbox = _idle.pop() if _idle else None
    if inbox is None:
        inbox = queue.SimpleQueue()
        threading.Thread(target=_serve_watches, args=(inbox,), name="host-watch", daemon=True).start()
    inbox.put((work, done))
    return done


class HostWatch:
    """Reads the host's stream on a thread of its own while a run goes on.

    ``fd`` is a descriptor of the stream, owned by the watch (pass a dup: it
    is closed by :meth:`close`); ``silence_s`` the longest the host may stay
    quiet.  :meth:`finished` is called once the run emitted its final event:
    from then on an end of the stream is the normal hang-up.  ``on_gone`` is
    what happens otherwise (tests pass their own).
    """

    def __init__(self, fd: int, silence_s: float, on_gone: Callable[[str], None] = stop_everything) -> None:
        self._fd = fd
        self._silence_s = silence_s
        self._on_gone = on_gone
        self._lock = threading.Lock()
        self._finished = False
        self._wake_r, self._wake_w = os.pipe()
        self._done: threading.Event | None = None

    def start(self) -> HostWatch:
        self._done = _on_a_thread(self._watch)
        return self

    def finished(self) -> None:
        with self._lock:
            self._finished = True

    def close(self) -> None:
        """Stop watching (the run is over) and close the descriptors: the next run's
        connection may get the same number, and no stale watch must read it."""
        self.finished()
        os.write(self._wake_w, b"\0")
        if self._done is not None:
            self._done.wait()
        for fd in (self._fd, self._wake_r, self._wake_w):
            os.close(fd)

    def _watch(self) -> None:
        poller = select.poll()
        poller.register(self._fd, select.POLLIN | select.POLLHUP | select.POLLERR)
        poller.register(self._wake_r, select.POLLIN)
        while True:
            ready = poller.poll(self._silence_s * 1000)
            if any(fd == self._wake_r for fd, _ in ready):
                return
            if not ready:
                why = f"no word from it for {self._silence_s:g}s"
            else:
                try:
                    if os.read(self._fd, 4096):
                        continue  # a beat
                    why = "its end of the run's stream was closed"
                except OSError as exc:
                    why = f"its stream failed: {exc}"
            with self._lock:
                if self._finished:
                    return  # the run is over: the host may hang up
                self._on_gone(why)
                return
