"""kombu's filesystem transport (the embedded broker), without its two races.

kombu's ``filesystem://`` transport is what the embedded installation uses as
its Celery broker.  Two of its file operations are not safe between
processes, and Flower (which broadcasts four inspect commands per refresh,
each binding a reply queue) makes both happen:

* A message file is written in place under the final ``*.msg`` name.  A
  consumer can move and read it before the writer has finished (the
  writer's ``flock`` does not stop a reader that never locks), and then
  fails on half a JSON document.  Here the file is written under a name no
  consumer picks up and renamed into place when complete.
* An exchange's binding table (``control/<exchange>.exchange``) is created
  with ``open("wb")``, which truncates the file *before* taking the lock.
  A second process creating it at the same time truncates a table another
  process is rewriting, then writes its shorter table over the start of the
  longer one: the file holds one JSON document followed by the rest of
  another ("Extra data"), and every broadcast on that exchange fails from
  then on (seen as Flower never listing a worker).  Here the file is opened
  without truncation, locked, then read, rewritten and truncated, and an
  empty table (created, not yet written) reads as no bindings.

A third change is not a race but a wait: kombu's transport finds new messages
by polling, so an idle worker heard of a message up to a polling interval
(``ORCHESTRATOR_BROKER_POLLING_INTERVAL``, 50 ms) late and spent about 1 % of
a core looking.  Here :meth:`Transport.drain_events` sleeps on an inotify
watch of the message folder instead and wakes when a ``*.msg`` file is
renamed (or, from kombu's own writer, closed) into it (the watch,
``orchestrator/core/folder_watch.py``, is shared with the chat streams'
wake-ups); a slow poll (:data:`SAFETY_POLL_S`) stays underneath, for an
event the kernel dropped (queue overflow) or a folder shared over a network
filesystem, where inotify sees only this machine's writes.  Where inotify
cannot be had (not Linux, the per-user instance or watch limit reached) the
transport polls as kombu does and logs a warning; ``ORCHESTRATOR_BROKER_WAKEUP=poll``
chooses that on purpose.

Others have met the two races upstream: treeverse/dvc-task#73 (the pidbox exchange
file turned invalid JSON under several workers) and celery/kombu#1551 (a
consumer decoding an empty message file).

The wire format and the folder layout are kombu's own, so processes using
either implementation can share one broker folder.  ``orchestrator.run.queue``
selects this transport for ``filesystem://`` URLs (Celery's
``broker_transport``).
"""

from __future__ import annotations

import fcntl
import logging
import os
import uuid
from pathlib import Path
from queue import Empty
from time import monotonic
from typing import Any

from kombu.exceptions import ChannelError
from kombu.transport import filesystem
from kombu.utils.encoding import bytes_to_str, str_to_bytes
from kombu.utils.json import dumps, loads

from orchestrator.core.folder_watch import FolderWatch

log = logging.getLogger(__name__)

# With inotify wake-ups, the folder is still listed this often without an
# event: a missed event (the kernel's queue overflowed, a writer on another
# machine of a network filesystem) delays a message by at most this much.
# Each look lists the folder once per queue consumed: next to nothing.
SAFETY_POLL_S = 1.0

# Suffix of a message file still being written: `_get` only takes names whose
# part after the first dot is exactly "<queue>.msg".
_PARTIAL = ".partial"


def _read_table(fd: int) -> list[filesystem.exchange_queue_t]:
    os.lseek(fd, 0, os.SEEK_SET)
    chunks = []
    while chunk := os.read(fd, 65536):
        chunks.append(chunk)
    raw = b"".join(chunks)
    return [filesystem.exchange_queue_t(*q) for q in loads(bytes_to_str(raw))] if raw.strip() else []


def _write_table(fd: int, queues: list[filesystem.exchange_queue_t]) -> None:
    data = str_to_bytes(dumps(queues))
    os.lseek(fd, 0, os.SEEK_SET)
    os.write(fd, data)
    os.ftruncate(fd, len(data))


class Channel(filesystem.Channel):
    def _open_table(self, exchange: str, create: bool) -> int | None:
        # kombu's filesystem Channel has _exchange_file; its stubs (celery-types) leave it out.
        file: Path = self._exchange_file(exchange)  # type: ignore[attr-defined]
        if create:
            self.control_folder.mkdir(exist_ok=True)
        try:
            return os.open(file, os.O_RDWR | (os.O_CREAT if create else 0), 0o644)
        except FileNotFoundError:
            return None
        except OSError as exc:
            raise ChannelError(f"Cannot open {file}") from exc

    # The filesystem Channel's named tuples, not the virtual Channel's plain ones (its stub says so too).
    def get_table(self, exchange: str) -> list[filesystem.exchange_queue_t]:  # type: ignore[override]
        fd = self._open_table(exchange, create=False)
        if fd is None:
            return []
        try:
            _flock(fd, shared=True)
            return _read_table(fd)
        finally:
            os.close(fd)  # closing the descriptor releases the lock

    def _queue_bind(self, exchange: str, routing_key: str, pattern: str | None, queue: str) -> None:
        fd = self._open_table(exchange, create=True)
        assert fd is not None
        try:
            _flock(fd, shared=False)
            queues = _read_table(fd)
            entry = filesystem.exchange_queue_t(routing_key or "", pattern or "", queue or "")
            if entry not in queues:
                _write_table(fd, [entry, *queues])
        finally:
            os.close(fd)

    def _delete(self, queue: str, exchange: str, routing_key: str, pattern: str, *args: Any, **kwargs: Any) -> None:
        # The virtual channel's own bookkeeping, without kombu's file update.
        super(filesystem.Channel, self)._delete(queue, exchange, routing_key, pattern, *args, **kwargs)
        fd = self._open_table(exchange, create=False)
        if fd is None:
            return
        try:
            _flock(fd, shared=False)
            queues = _read_table(fd)
            entry = filesystem.exchange_queue_t(routing_key or "", pattern or "", queue or "")
            if entry in queues:
                queues.remove(entry)
                _write_table(fd, queues)
        finally:
            os.close(fd)

    # kombu's filesystem Channel calls the virtual Channel's `message` `payload`; both pass it by position.
    def _put(self, queue: str, payload: Any, **kwargs: Any) -> None:  # type: ignore[override]
        """Put ``payload`` on ``queue``: written whole, then renamed into view."""
        name = f"{int(round(monotonic() * 1000))}_{uuid.uuid4()}.{queue}.msg"
        final = os.path.join(self.data_folder_out, name)
        partial = final + _PARTIAL
        try:
            with open(partial, "wb") as f:
                f.write(str_to_bytes(dumps(payload)))
            os.replace(partial, final)
        except OSError as exc:
            raise ChannelError(f"Cannot add file {final!r} to directory") from exc


def _flock(fd: int, *, shared: bool) -> None:
    # Held until the descriptor is closed.
    fcntl.flock(fd, fcntl.LOCK_SH if shared else fcntl.LOCK_EX)


class Transport(filesystem.Transport):
    Channel = Channel

    def __init__(self, client: Any, **kwargs: Any) -> None:
        super().__init__(client, **kwargs)
        options = client.transport_options
        self._folder: str = options.get("data_folder_in", "data_in")
        # "inotify" (the default) or "poll": kombu's polling every polling_interval
        # (the baseline of bench/wakeup.py, and the way a platform without inotify works).
        self._wakeup: str = options.get("wakeup", "inotify")
        self._safety_poll_s = float(options.get("safety_poll_interval", SAFETY_POLL_S))
        self._watch: FolderWatch | None = None

    def _folder_watch(self) -> FolderWatch | None:
        """The folder's watch, made on first use; None: poll as kombu does."""
        watch = self._watch
        if watch is not None and (watch.gone or watch.pid != os.getpid()):
            # A dead watch, or one inherited across a fork (its events are the parent's too).
            if watch.pid == os.getpid():
                watch.close()
            watch = self._watch = None
        if watch is None and self._wakeup == "inotify":
            try:
                # Moved in: our writer renames a finished file into place; closed: kombu's
                # own writer (another process on the same folder) writes in place.
                watch = self._watch = FolderWatch(self._folder, closed=True, moved_in=True)
            except (ImportError, OSError) as exc:
                log.warning(
                    "filesystem broker: no inotify on %s (%s); polling every %.3f s instead",
                    self._folder,
                    exc,
                    self.polling_interval or 0,
                )
                self._wakeup = "poll"
        return watch

    # The stubs (celery-types) type drain_events loosely; kombu calls it with the connection and a timeout.
    def drain_events(self, connection: Any, timeout: float | None = None) -> None:  # type: ignore[override]
        watch = self._folder_watch()
        if watch is None:
            super().drain_events(connection, timeout=timeout)
            return
        start = monotonic()
        assert self.cycle is not None  # made with the transport (typed Optional)
        get = self.cycle.get
        look = True
        while True:
            if look:
                try:
                    get(self._deliver, timeout=timeout)
                    return
                except Empty:
                    pass
            # A consumer whose prefetch is full (a task still unacknowledged) takes
            # nothing, whatever wakes it, and the ack that frees it is no file
            # event: meanwhile look every polling_interval, as kombu does.
            consuming = self._can_consume()
            wait = self._safety_poll_s if consuming else (self.polling_interval or 0.05)
            if timeout is not None:
                left = timeout - (monotonic() - start)
                if left <= 0:
                    raise TimeoutError()
                wait = min(wait, left)
            names = watch.wait(wait)
            # Only files our own writers closed and have yet to rename into view (the watch
            # also hears kombu's in-place writers close theirs): the rename wakes us again,
            # and looking now finds nothing but costs the folder's listing per queue.  (A
            # full prefetch looks every time: the ack that frees it is no file event.)
            look = not (consuming and names and all(name.endswith(_PARTIAL) for name in names))
            if watch.gone:
                watch = self._folder_watch() or watch  # made anew (a folder put back) or polled

    def _can_consume(self) -> bool:
        # Every consuming channel: the remote-control channel's is never full, the tasks' one is.
        return all(ch.qos.can_consume() for ch in self.channels or () if ch._consumers)

    def close_connection(self, connection: Any) -> None:
        super().close_connection(connection)
        if self._watch is not None and self._watch.pid == os.getpid():
            self._watch.close()
        self._watch = None
