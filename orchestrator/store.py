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

from .context import parse_context
from .db import Database, get_database
from .envelopes import TEXT, normalize_message_metadata, preview_for
from .errors import InvalidMessage, MessageNotFound
from .messages import MESSAGE_TYPES, NEVER_STORED_SENDERS, NewMessage, StoredMessage, sender_type_problem
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
        superseded_at=row.superseded_at,
        edited_at=row.edited_at,
    )


def _validate(new: NewMessage) -> None:
    if not new.id:
        raise InvalidMessage("message id must not be empty")
    if not new.chat_jid:
        raise InvalidMessage("chat_jid must not be empty")
    if not new.sender:
        raise InvalidMessage("sender must not be empty")
    for name in ("id", "chat_jid", "sender"):
        if "\x00" in getattr(new, name):
            raise InvalidMessage(f"{name} must not contain NUL characters")
    if new.sender in NEVER_STORED_SENDERS:
        raise InvalidMessage(f"sender {new.sender!r} is ephemeral and is never stored")
    if new.message_type not in MESSAGE_TYPES:
        raise InvalidMessage(
            f"message_type {new.message_type!r} is not one of {sorted(MESSAGE_TYPES)}"
        )
    if problem := sender_type_problem(new.sender, new.message_type):
        raise InvalidMessage(problem)
    try:
        datetime.fromisoformat(new.timestamp)
    except (TypeError, ValueError):
        raise InvalidMessage(f"timestamp {new.timestamp!r} is not an ISO-8601 date-time") from None


def _normalized(new: NewMessage) -> NewMessage:
    """Validate the metadata (envelope, context items); give an empty
    structured message a readable preview, so every channel has text to show."""
    meta = normalize_message_metadata(new.metadata)
    parse_context(meta)
    update: dict[str, Any] = {"metadata": meta}
    if not new.content.strip() and meta and meta.get("message_type") not in (None, TEXT):
        update["content"] = preview_for(meta)
    return new.model_copy(update=update)


def _without_nul(new: NewMessage) -> NewMessage:
    # PostgreSQL text cannot hold NUL (U+0000) and a command's output may
    # contain it; store U+FFFD instead, on every backend alike.
    # (JSON metadata is stored escaped and keeps it.)
    bad = {k: v.replace("\x00", "\ufffd") for k in ("sender_name", "content")
           if "\x00" in (v := getattr(new, k))}
    return new.model_copy(update=bad) if bad else new


def _lock_seq(session: Session, db: Database) -> None:
    # SQLite: the write transaction began IMMEDIATE, so we already hold the
    # only write lock.  PostgreSQL: a transaction-scoped advisory lock makes
    # "max + 1" and the commit one critical section, so seq order is commit
    # order and a reader that saw seq N can never later find a smaller one.
    if not db.is_sqlite:
        session.execute(text("SELECT pg_advisory_xact_lock(726932)"))


def insert_message(session: Session, db: Database, new: NewMessage) -> tuple[StoredMessage, bool]:
    """Insert inside the caller's transaction; returns (message, created)."""
    _validate(new)
    new = _without_nul(_normalized(new))
    # Lock first, then look: on PostgreSQL two transactions storing the same
    # (id, chat_jid) at once would otherwise both find nothing and the second
    # INSERT would fail on the primary key instead of returning the first copy.
    # (On SQLite the IMMEDIATE transaction already serializes the look.)
    _lock_seq(session, db)
    existing = session.scalar(
        select(MessageRow).where(MessageRow.id == new.id, MessageRow.chat_jid == new.chat_jid)
    )
    if existing is not None:
        return to_stored(existing), False
    seq = (session.scalar(select(func.max(MessageRow.seq))) or 0) + 1
    fields = new.model_dump()
    meta = fields.pop("metadata")
    session.execute(insert(MessageRow).values(seq=seq, meta=meta, **fields))
    return StoredMessage(seq=seq, **new.model_dump()), True


def store_message_direct(*, db: Database | None = None, **fields: Any) -> StoredMessage:
    """Store one message in its own transaction (no routing, no signal).

    Keyword arguments: ``id, chat_jid, sender, sender_name, content,
    timestamp, is_from_me, message_type='user', metadata=None``.  Returns the
    stored message; if ``(id, chat_jid)`` already exists the existing row is
    returned unchanged.  Bad input raises :class:`InvalidMessage`.
    """
    try:
        new = NewMessage(**fields)
    except ValidationError as exc:
        raise InvalidMessage(_first_error(exc)) from exc
    db = db or get_database(get_settings())
    with db.write() as session:
        msg, _ = insert_message(session, db, new)
    return msg


def _first_error(exc: ValidationError) -> str:
    err = exc.errors()[0]
    where = ".".join(str(p) for p in err.get("loc", ())) or "message"
    return f"{where}: {err.get('msg', 'invalid')}"


def _live(stmt: Any, include_superseded: bool) -> Any:
    # Superseded messages (regenerate, truncate) stay for audit only.
    return stmt if include_superseded else stmt.where(MessageRow.superseded_at.is_(None))


def get_messages_since(
    chat_jid: str, since_timestamp: str | None = None, *, include_superseded: bool = False,
    db: Database | None = None,
) -> list[StoredMessage]:
    """A chat's messages with a timestamp after ``since_timestamp``, in seq order.

    Kept for compatibility with timestamp cursors; the pipeline itself uses
    :func:`get_messages_after` (seq cursor), which cannot lose equal-time rows.
    """
    db = db or get_database(get_settings())
    stmt = _live(select(MessageRow).where(MessageRow.chat_jid == chat_jid), include_superseded)
    if since_timestamp:
        # ISO-8601 text compares correctly only byte by byte: SQLite's default;
        # on PostgreSQL the database's collation (ICU en-US puts
        # "00.000001+00:00" before "00+00:00") must not decide.
        column = MessageRow.timestamp if db.is_sqlite else MessageRow.timestamp.collate("C")
        stmt = stmt.where(column > since_timestamp)
    with db.read() as session:
        return [to_stored(r) for r in session.scalars(stmt.order_by(MessageRow.seq))]


def get_messages_after(
    chat_jid: str, after_seq: int = 0, *, limit: int | None = None, include_superseded: bool = False,
    db: Database | None = None,
) -> list[StoredMessage]:
    """A chat's messages with ``seq > after_seq``, oldest first."""
    db = db or get_database(get_settings())
    stmt = _live(
        select(MessageRow).where(MessageRow.chat_jid == chat_jid, MessageRow.seq > after_seq),
        include_superseded,
    ).order_by(MessageRow.seq)
    if limit is not None:
        stmt = stmt.limit(limit)
    with db.read() as session:
        return [to_stored(r) for r in session.scalars(stmt)]


def get_recent_messages(
    chat_jid: str, limit: int, *, before_seq: int | None = None, include_superseded: bool = False,
    db: Database | None = None,
) -> list[StoredMessage]:
    """The newest ``limit`` messages of a chat (below ``before_seq`` if given), oldest first."""
    db = db or get_database(get_settings())
    stmt = _live(select(MessageRow).where(MessageRow.chat_jid == chat_jid), include_superseded)
    if before_seq is not None:
        stmt = stmt.where(MessageRow.seq < before_seq)
    stmt = stmt.order_by(MessageRow.seq.desc()).limit(limit)
    with db.read() as session:
        rows = [to_stored(r) for r in session.scalars(stmt)]
    rows.reverse()
    return rows


def resolve_message(chat_jid: str, ref: str, *, db: Database | None = None) -> StoredMessage:
    """A message by id, or by ``#seq`` as ``orchestrator history`` prints it."""
    db = db or get_database(get_settings())
    stmt = select(MessageRow).where(MessageRow.chat_jid == chat_jid)
    if ref.startswith("#") and ref[1:].isdigit():
        stmt = stmt.where(MessageRow.seq == int(ref[1:]))
    else:
        stmt = stmt.where(MessageRow.id == ref)
    with db.read() as session:
        row = session.scalar(stmt)
        if row is None:
            raise MessageNotFound(chat_jid, ref)
        return to_stored(row)
