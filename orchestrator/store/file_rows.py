"""The ``files`` table's rows: a chat's reference to stored content (:class:`StoredFile`).

A row per reference (a chat storing a file): an opaque, unguessable id (:func:`new_file_id`),
the content's SHA-256 and size, the MIME type sniffed from the bytes, the sender's name made
safe, the referring chat, the chat that stored the content first (``owner_jid``) and the
time.  A group's files count against its limit by the contents it stored first, each once
(:func:`group_bytes`).  Written by the file store (``store/files.py``) alone.
"""

from __future__ import annotations

import secrets
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from orchestrator.store.db import Connection, db_time, driver_execute

# The columns every read of a row selects, in StoredFile's order.
COLUMNS = "id, chat_jid, sha256, size, mime, name, owner_jid, created_at"


@dataclass(frozen=True)
class StoredFile:
    """A file as a chat stored it (a row of ``files``)."""

    id: str
    chat_jid: str
    sha256: str
    size: int
    mime: str
    name: str
    owner_jid: str  # the chat that stored these bytes first
    created_at: datetime


def stored_file(row: Any) -> StoredFile:
    """A row read with :data:`COLUMNS`."""
    id_, chat_jid, sha256, size, mime, name, owner_jid, created_at = row
    created = db_time(created_at)
    assert created is not None
    return StoredFile(str(id_), str(chat_jid), str(sha256), int(size), str(mime), str(name), str(owner_jid), created)


def group_bytes(conn: Connection, chat_jid: str) -> int:
    """In the caller's transaction: the bytes of the contents ``chat_jid`` stored first, each once."""
    row = driver_execute(
        conn,
        "SELECT COALESCE(SUM(size), 0) FROM "
        "(SELECT DISTINCT sha256, size FROM files WHERE owner_jid = :chat_jid) AS owned",
        {"chat_jid": chat_jid},
    ).fetchone()
    return int(row[0])


def db_value(conn: Connection, value: datetime) -> object:
    """``value`` as a raw statement binds it for ``created_at``."""
    # SQLite stores UTC text as the ORM's UTCDateTime does (six-digit fraction, no zone).
    if conn.dialect.name == "sqlite":
        return value.replace(tzinfo=None).isoformat(sep=" ", timespec="microseconds")
    return value


def new_file_id() -> str:
    """An opaque, unguessable id (24 characters of ``secrets.token_urlsafe``) that never
    begins with ``-``: people pass it on command lines (``files rm CHAT ID``), where that
    would read as an option."""
    while (file_id := secrets.token_urlsafe(18)).startswith("-"):
        pass
    return file_id
