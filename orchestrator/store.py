"""The message store: the single source of truth for every chat.

``store_message_direct`` is idempotent on ``(id, chat_jid)``: storing the same
message twice keeps the first copy.  Each new row gets the next ``seq``, a
cursor that is monotonic in commit order (see ``_next_seq``).
"""

from __future__ import annotations

import uuid
from datetime import UTC, datetime
from typing import Any

from pydantic import ValidationError
from sqlalchemy import func, insert, select, text
from sqlalchemy.orm import Session

from .db import Database, get_database
from .errors import InvalidMessage
from .messages import MESSAGE_TYPES, NEVER_STORED_SENDERS, StoredMessage
from .settings import get_settings
from .tables import MessageRow


def now_iso() -> str:
    return datetime.now(UTC).isoformat()


def new_message_id(prefix: str = "msg") -> str:
    return f"{prefix}-{uuid.uuid4().hex}"


def to_stored(row: MessageRow) -> StoredMessage:
    return StoredMessage(
        seq=row.seq,
        id=row.id,
        chat_jid=row.chat_jid,
        sender=row.sender,
        sender_name=row.sender_name,
        content=row.content,
        timestamp=row.timestamp,
        is_from_me=row.is_from_me,
        message_type=row.message_type,  # type: ignore[arg-type]
        metadata=row.meta,
    )


def _validate(
    *, id: str, chat_jid: str, sender: str, message_type: str, metadata: Any, timestamp: str
) -> None:
    if not id:
        raise InvalidMessage("message id must not be empty")
    if not chat_jid:
        raise InvalidMessage("chat_jid must not be empty")
    if not sender:
        raise InvalidMessage("sender must not be empty")
    if sender in NEVER_STORED_SENDERS:
        raise InvalidMessage(f"sender {sender!r} is ephemeral and is never stored")
    if message_type not in MESSAGE_TYPES:
        raise InvalidMessage(
            f"message_type {message_type!r} is not one of {sorted(MESSAGE_TYPES)}"
        )
    if metadata is not None and not isinstance(metadata, dict):
        raise InvalidMessage(f"metadata must be a JSON object or null, got {type(metadata).__name__}")
    try:
        datetime.fromisoformat(timestamp)
    except (TypeError, ValueError):
        raise InvalidMessage(f"timestamp {timestamp!r} is not an ISO-8601 date-time") from None


def _next_seq(session: Session, db: Database) -> None:
    # SQLite: the write transaction began IMMEDIATE, so we already hold the
    # only write lock.  PostgreSQL: a transaction-scoped advisory lock makes
    # "max + 1" and the commit one critical section, so seq order is commit
    # order and a reader that saw seq N can never later find a smaller one.
    if not db.is_sqlite:
        session.execute(text("SELECT pg_advisory_xact_lock(726932)"))


def insert_message(
    session: Session,
    db: Database,
    *,
    id: str,
    chat_jid: str,
    sender: str,
    sender_name: str,
    content: str,
    timestamp: str,
    is_from_me: bool,
    message_type: str = "user",
    metadata: dict[str, Any] | None = None,
) -> tuple[StoredMessage, bool]:
    """Insert inside the caller's transaction; returns (message, created)."""
    _validate(
        id=id, chat_jid=chat_jid, sender=sender, message_type=message_type,
        metadata=metadata, timestamp=timestamp,
    )
    existing = session.get(MessageRow, (id, chat_jid))
    if existing is not None:
        return to_stored(existing), False
    _next_seq(session, db)
    seq = (session.scalar(select(func.max(MessageRow.seq))) or 0) + 1
    session.execute(
        insert(MessageRow).values(
            id=id, chat_jid=chat_jid, seq=seq, sender=sender, sender_name=sender_name or "",
            content=content or "", timestamp=timestamp, is_from_me=bool(is_from_me),
            message_type=message_type, meta=metadata,
        )
    )
    try:
        msg = StoredMessage(
            seq=seq, id=id, chat_jid=chat_jid, sender=sender, sender_name=sender_name or "",
            content=content or "", timestamp=timestamp, is_from_me=bool(is_from_me),
            message_type=message_type,  # type: ignore[arg-type]
            metadata=metadata,
        )
    except ValidationError as exc:  # pragma: no cover - _validate covers these
        raise InvalidMessage(str(exc)) from exc
    return msg, True


def store_message_direct(
    *,
    id: str,
    chat_jid: str,
    sender: str,
    sender_name: str,
    content: str,
    timestamp: str,
    is_from_me: bool,
    message_type: str = "user",
    metadata: dict[str, Any] | None = None,
    db: Database | None = None,
) -> StoredMessage:
    """Store one message in its own transaction (no routing, no signal).

    Returns the stored message; if ``(id, chat_jid)`` already exists the
    existing row is returned unchanged.
    """
    db = db or get_database(get_settings())
    with db.write() as session:
        msg, _ = insert_message(
            session, db, id=id, chat_jid=chat_jid, sender=sender, sender_name=sender_name,
            content=content, timestamp=timestamp, is_from_me=is_from_me,
            message_type=message_type, metadata=metadata,
        )
    return msg


def get_messages_since(
    chat_jid: str, since_timestamp: str | None = None, *, db: Database | None = None
) -> list[StoredMessage]:
    """A chat's messages with a timestamp after ``since_timestamp``, in seq order.

    Kept for compatibility with timestamp cursors; the pipeline itself uses
    :func:`get_messages_after` (seq cursor), which cannot lose equal-time rows.
    """
    db = db or get_database(get_settings())
    stmt = select(MessageRow).where(MessageRow.chat_jid == chat_jid)
    if since_timestamp:
        stmt = stmt.where(MessageRow.timestamp > since_timestamp)
    with db.read() as session:
        return [to_stored(r) for r in session.scalars(stmt.order_by(MessageRow.seq))]


def get_messages_after(
    chat_jid: str, after_seq: int = 0, *, limit: int | None = None, db: Database | None = None
) -> list[StoredMessage]:
    """A chat's messages with ``seq > after_seq``, oldest first."""
    db = db or get_database(get_settings())
    stmt = (
        select(MessageRow)
        .where(MessageRow.chat_jid == chat_jid, MessageRow.seq > after_seq)
        .order_by(MessageRow.seq)
    )
    if limit is not None:
        stmt = stmt.limit(limit)
    with db.read() as session:
        return [to_stored(r) for r in session.scalars(stmt)]


def get_recent_messages(
    chat_jid: str, limit: int, *, before_seq: int | None = None, db: Database | None = None
) -> list[StoredMessage]:
    """The newest ``limit`` messages of a chat (below ``before_seq`` if given), oldest first."""
    db = db or get_database(get_settings())
    stmt = select(MessageRow).where(MessageRow.chat_jid == chat_jid)
    if before_seq is not None:
        stmt = stmt.where(MessageRow.seq < before_seq)
    stmt = stmt.order_by(MessageRow.seq.desc()).limit(limit)
    with db.read() as session:
        rows = [to_stored(r) for r in session.scalars(stmt)]
    rows.reverse()
    return rows
