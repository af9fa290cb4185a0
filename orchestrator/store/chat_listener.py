"""One process's ear for chat wake-ups (``store/chat_wakeups.py``), fanned out to its readers.

A reader (an open event stream of the API, the terminal chat's follower) calls
:func:`listen` with its chat and a ``wake`` callable, reads the chat, and reads it again
each time ``wake`` is called, or after its safety poll (``ORCHESTRATOR_STREAM_SAFETY_POLL_S``)
when nothing woke it.  A wake-up says only "look now": the database is the truth, a
spurious one costs a look, a lost one the safety poll.

Per process and database there is one listener, a thread started with the first
subscription and ended some seconds after the last one closed (a page reloaded does not
reconnect it):

* PostgreSQL: one connection of its own, in autocommit, ``LISTEN orchestrator_chat``;
  psycopg's ``notifies()`` hands over each notification (its payload, the chat id).
  A lost connection (a server restart, a backend ended) is made again after a backoff.
* SQLite: an inotify watch (``orchestrator/core/folder_watch.py``, the embedded broker's
  too) of the wake-up folder; each file closed after writing names a chat by its digest.
  A folder removed is made and watched again.  Where inotify cannot be had, nothing
  wakes the readers and they look at their safety poll (a warning is logged).

Each time the listener is ready (the first time, and after every reconnect or new watch)
it wakes every reader: what changed while it was not listening is then looked at, so a
reader that subscribes before its first read loses nothing.  A listener without readers
whose connection fails ends at once rather than reconnect.

``wake`` is called on the listener's thread: it must be quick and thread-safe (an
``Event.set``, a ``loop.call_soon_threadsafe``); an exception from it is logged, never
passed on.
"""

from __future__ import annotations

import logging
import os
import threading
import time
import weakref
from collections.abc import Callable
from pathlib import Path
from typing import Any

from orchestrator.core.backoff import backoff_delay
from orchestrator.core.folder_watch import FolderWatch
from orchestrator.store.chat_wakeups import CHANNEL, wake_folder, wake_name
from orchestrator.store.db import Database, driver_message

log = logging.getLogger(__name__)

Wake = Callable[[], None]

# How often the thread looks up from its wait to see whether it should end.
TICK_S = 0.5
# How long a listener without readers stays connected (a page reloaded, a stream reconnecting).
LINGER_S = 10.0
RECONNECT_BASE_S = 0.5
RECONNECT_MAX_S = 10.0


class Subscription:
    """One reader's interest in one chat: ``close`` (or the ``with`` block's end) ends it."""

    def __init__(self, listener: ChatListener, chat_jid: str, wake: Wake) -> None:
        self.listener, self.chat_jid, self.wake = listener, chat_jid, wake

    def close(self) -> None:
        self.listener.unsubscribe(self)

    def __enter__(self) -> Subscription:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class ChatListener:
    """The listener of one database in this process (see the module's docstring)."""

    def __init__(self, db: Database) -> None:
        self.db = db
        self.pid = os.getpid()
        self.closed = False  # ended (no readers for LINGER_S): the next reader makes a new one
        self._subs: dict[str, set[Subscription]] = {}
        self._names: dict[str, str] = {}  # SQLite: wake-up file name -> chat id
        self._lock = threading.Lock()
        self._idle_since: float | None = None
        self._thread = threading.Thread(target=self._run, name="chat-listener", daemon=True)
        self._thread.start()

    # -- readers ------------------------------------------------------------

    def subscribe(self, chat_jid: str, wake: Wake) -> Subscription:
        sub = Subscription(self, chat_jid, wake)
        with self._lock:
            self._subs.setdefault(chat_jid, set()).add(sub)
            self._names[wake_name(chat_jid)] = chat_jid
            self._idle_since = None
        return sub

    def unsubscribe(self, sub: Subscription) -> None:
        with self._lock:
            subs = self._subs.get(sub.chat_jid)
            if subs is not None:
                subs.discard(sub)
                if not subs:
                    del self._subs[sub.chat_jid]
                    self._names.pop(wake_name(sub.chat_jid), None)
            if not self._subs and self._idle_since is None:
                self._idle_since = time.monotonic()

    def _wake(self, chat_jid: str | None) -> None:
        """Wake the readers of ``chat_jid`` (None: of every chat)."""
        with self._lock:
            if chat_jid is None:
                subs = [s for group in self._subs.values() for s in group]
            else:
                subs = list(self._subs.get(chat_jid, ()))
        for sub in subs:
            try:
                sub.wake()
            except Exception as exc:  # noqa: BLE001 - one reader's failure must not stop the others' wake-ups
                log.warning("waking a reader of %s: %s", sub.chat_jid, exc)

    def _chat_of(self, name: str) -> str | None:
        with self._lock:
            return self._names.get(name)

    def _over(self, linger_s: float = LINGER_S) -> bool:
        """True once the listener has had no reader for ``linger_s`` (then it is closed for good)."""
        with _registry_lock, self._lock:
            if self._idle_since is None or time.monotonic() - self._idle_since < linger_s:
                return False
            self.closed = True
            if _listeners.get(self.db) is self:
                del _listeners[self.db]
            return True

    # -- the thread -----------------------------------------------------------

    def _run(self) -> None:
        folder = wake_folder(self.db)
        if self.db.is_sqlite:
            if folder is not None:
                self._watch_folder(folder)
        else:
            self._listen_pg()

    def _watch_folder(self, folder: Path) -> None:
        while not self._over():
            try:
                folder.mkdir(mode=0o700, parents=True, exist_ok=True)
                watch = FolderWatch(folder, closed=True, moved_in=False)
            except (ImportError, OSError) as exc:
                log.warning(
                    "chat wake-ups: no inotify watch of %s (%s): open streams look only at their safety poll "
                    "(ORCHESTRATOR_STREAM_SAFETY_POLL_S)",
                    folder,
                    exc,
                )
                return
            try:
                self._wake(None)  # ready: what changed before the watch existed is looked at
                while not watch.gone and not self._over():
                    for name in watch.wait(TICK_S):
                        if (chat_jid := self._chat_of(name)) is not None:
                            self._wake(chat_jid)
            finally:
                watch.close()

    def _listen_pg(self) -> None:
        import psycopg

        failures = 0
        while not self._over():
            conn: psycopg.Connection[Any] | None = None
            try:
                conninfo = self.db.engine.url.set(drivername="postgresql").render_as_string(hide_password=False)
                conn = psycopg.connect(conninfo, autocommit=True, application_name="orchestrator-chat-listener")
                conn.execute(f"LISTEN {CHANNEL}")
                failures = 0
                self._wake(None)  # ready: what changed while not listening is looked at
                while not self._over():
                    for note in conn.notifies(timeout=TICK_S):
                        self._wake(note.payload)
            except psycopg.Error as exc:
                if self._over(linger_s=0):
                    return  # nobody to wake: no reconnecting for nobody (the next reader starts anew)
                failures += 1
                if failures <= 3:  # a database that stays away must not flood the log
                    log.warning(
                        "chat wake-ups: the LISTEN connection failed (%s); open streams look at their "
                        "safety poll until it is back",
                        driver_message(exc),
                    )
                time.sleep(backoff_delay(failures, RECONNECT_BASE_S, RECONNECT_MAX_S))
            finally:
                if conn is not None:
                    conn.close()


_listeners: weakref.WeakKeyDictionary[Database, ChatListener] = weakref.WeakKeyDictionary()
_registry_lock = threading.Lock()


def listen(db: Database, chat_jid: str, wake: Wake) -> Subscription:
    """Call ``wake`` whenever ``chat_jid`` may have changed in ``db``, until the subscription
    is closed.  Subscribe before the first read of the chat."""
    with _registry_lock:
        listener = _listeners.get(db)
        if listener is None or listener.closed or listener.pid != os.getpid():
            # None yet, one ended, or one inherited across a fork (its thread is the parent's).
            listener = _listeners[db] = ChatListener(db)
        return listener.subscribe(chat_jid, wake)
