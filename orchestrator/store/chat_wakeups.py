"""A chat's wake-up: "look now" to its open streams, sent when a change of the chat commits.

The chat's event streams (the API's, ``orchestrator/http/stream.py``) and the terminal chat
(``orchestrator/cli/chat.py``) read the database, which stays the only truth; a wake-up
carries nothing but the chat's id and only says that something of the chat changed: a
message stored (:func:`~orchestrator.store.message_log.insert_message`, every path), a
running run's draft written or dropped (``store/drafts.py``), a run created or its state or
attempt changed (``store/runs.py``), the history changed in place (``store/history.py``).
The readers hear it through ``store/chat_listener.py`` and keep a slow safety poll
(``ORCHESTRATOR_STREAM_SAFETY_POLL_S``) for a wake-up that was lost.

It is sent after the commit, never before (a reader woken early would find nothing, and
nothing would wake it again):

* PostgreSQL: ``pg_notify('orchestrator_chat', <chat_jid>)`` in the writer's own
  transaction, which the server delivers at commit (and drops on rollback; several
  identical ones of one transaction are delivered once).  The fixed statements of the hot
  paths call it in their ``RETURNING`` (:data:`NOTIFY_RETURNING`): no round trip of its own.
* SQLite (one machine): the chat is remembered on the connection and, once the
  connection goes back to the pool (after its commit, before any other transaction can
  use it), a file of the chat's in :func:`wake_folder` is opened for writing and closed:
  an inotify ``IN_CLOSE_WRITE`` for every watcher on this machine.  One empty file per
  chat, named after a digest of its id (ids may hold any character); a rollback forgets
  the chats.  A failed touch is logged and left to the safety poll: the change is
  committed already, and must not fail.
"""

from __future__ import annotations

import hashlib
import logging
import os
import threading
import weakref
from pathlib import Path
from typing import Any

from sqlalchemy import Connection, Engine, event
from sqlalchemy.orm import Session

from orchestrator.store.db import Database, driver_execute

log = logging.getLogger(__name__)

CHANNEL = "orchestrator_chat"
# For a PostgreSQL statement's RETURNING list on a table with a ``chat_jid`` column: the
# wake-up of each row's chat, in the statement itself.
NOTIFY_RETURNING = f"pg_notify('{CHANNEL}', chat_jid)"
_NOTIFY = f"SELECT pg_notify('{CHANNEL}', :chat_jid)"
# Beside the SQLite file (the data dir's orchestrator.db): every process of the
# installation opens the same file, so it finds the same folder.
WAKE_FOLDER = "chat-wakeups"
_PENDING = "orchestrator_chat_wakeups"  # key in a pooled connection's info: chats to wake after its commit
_hooked: weakref.WeakSet[Engine] = weakref.WeakSet()  # the engines whose pool touches the files
_hook_lock = threading.Lock()


def wake_folder(db: Database) -> Path | None:
    """Where the SQLite database's chat wake-up files are (None: PostgreSQL, or a database in memory)."""
    return _folder_of(db.engine) if db.is_sqlite else None


def wake_name(chat_jid: str) -> str:
    """The name of the chat's wake-up file."""
    return hashlib.sha256(chat_jid.encode("utf-8", "surrogatepass")).hexdigest()[:32]


def chat_changed(tx: Session | Connection, chat_jid: str) -> None:
    """Wake the chat's readers when the caller's transaction ``tx`` commits (nothing if it rolls back)."""
    conn = tx.connection() if isinstance(tx, Session) else tx
    if conn.dialect.name != "sqlite":
        driver_execute(conn, _NOTIFY, {"chat_jid": chat_jid})
        return
    _hook(conn.engine)
    pending: set[str] = conn.info.setdefault(_PENDING, set())
    pending.add(chat_jid)


def _hook(engine: Engine) -> None:
    if engine in _hooked:
        return
    with _hook_lock:
        if engine in _hooked:
            return
        folder = _folder_of(engine)

        @event.listens_for(engine, "rollback")
        def _forget(conn: Connection) -> None:
            conn.info.pop(_PENDING, None)

        @event.listens_for(engine, "checkin")
        def _wake(_dbapi_conn: Any, record: Any) -> None:
            # Back in the pool: the transaction that noted the chats is over (committed,
            # or rolled back and forgotten above).
            chats = record.info.pop(_PENDING, None)
            if chats and folder is not None:
                touch(folder, chats)

        _hooked.add(engine)


def _folder_of(engine: Engine) -> Path | None:
    path = engine.url.database
    if not path or path == ":memory:":
        return None
    return Path(path).resolve().parent / WAKE_FOLDER


def touch(folder: Path, chats: set[str] | list[str]) -> None:
    """Wake every watcher of ``chats``' files in ``folder`` (on this machine)."""
    for chat_jid in chats:
        target = folder / wake_name(chat_jid)
        try:
            try:
                fd = os.open(target, os.O_WRONLY | os.O_CREAT | os.O_CLOEXEC | os.O_NOFOLLOW, 0o600)
            except FileNotFoundError:
                folder.mkdir(mode=0o700, parents=True, exist_ok=True)
                fd = os.open(target, os.O_WRONLY | os.O_CREAT | os.O_CLOEXEC | os.O_NOFOLLOW, 0o600)
            os.close(fd)  # closed after opening for writing: IN_CLOSE_WRITE, nothing written
        except OSError as exc:
            log.warning("could not wake the streams of %s (the safety poll will): %s", chat_jid, exc)
