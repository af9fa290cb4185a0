"""The message store: the single source of truth for every chat.

``store_message_direct`` is idempotent on ``(id, chat_jid)``: storing the same
message twice keeps the first copy.  Each new row gets the next ``seq``, a
cursor that is monotonic in commit order (see ``_next_seq``).
"""

from __future__ import annotations

import functools
import json
import uuid
from datetime import UTC, datetime
from typing import Any

from pydantic import ValidationError
from sqlalchemy import Connection, bindparam, func, select
from sqlalchemy.orm import Session

from orchestrator.core.errors import InvalidMessage, MessageNotFound
from orchestrator.core.jsontypes import JsonObject
from orchestrator.model.context import parse_context
from orchestrator.model.envelopes import FILE, TEXT, files_of, normalize_message_metadata, preview_for
from orchestrator.model.messages import (
    MESSAGE_TYPES,
    NEVER_STORED_SENDERS,
    SENDER_BOT,
    NewMessage,
    StoredMessage,
    sender_type_problem,
)
from orchestrator.store.chat_wakeups import NOTIFY_RETURNING, chat_changed
from orchestrator.store.db import Database, db_time, driver_execute
from orchestrator.store.tables import MessageRow


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
        message_type=row.message_type,  # type: ignore[arg-type]  # a str column; the model checks the Literal
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
        raise InvalidMessage(f"message_type {new.message_type!r} is not one of {sorted(MESSAGE_TYPES)}")
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
    # A FILE message's words may be none: its files are drawn after them wherever it is read.
    if not new.content.strip() and meta and meta.get("message_type") not in (None, TEXT, FILE):
        return new.model_copy(update={"metadata": meta, "content": preview_for(meta)})
    return new.model_copy(update={"metadata": meta})


def _without_nul(new: NewMessage) -> NewMessage:
    # PostgreSQL text cannot hold NUL (U+0000) and a command's output may
    # contain it; store U+FFFD instead, on every backend alike.
    # (JSON metadata is stored escaped and keeps it.)
    bad = {k: v.replace("\x00", "\ufffd") for k in ("sender_name", "content") if "\x00" in (v := getattr(new, k))}
    return new.model_copy(update=bad) if bad else new


def _lock_seq(conn: Connection, db: Database) -> None:
    # SQLite: the write transaction began IMMEDIATE, so we already hold the
    # only write lock.  PostgreSQL: a transaction-scoped advisory lock makes
    # "max + 1" and the commit one critical section, so seq order is commit
    # order and a reader that saw seq N can never later find a smaller one.
    # It must be its own statement: at READ COMMITTED each statement reads a
    # fresh snapshot, so the INSERT that follows sees the previous holder's
    # commit (a lock taken inside the INSERT would not).
    if not db.is_sqlite:
        driver_execute(conn, _SEQ_LOCK)


_SEQ_LOCK = "SELECT pg_advisory_xact_lock(726932)"
# One round trip: the next seq (max + 1, under the caller's write lock; the
# unique index on seq makes max() one index probe), the row unless (id,
# chat_jid) is already stored, and its seq (no row back: a duplicate).
_INSERT = """INSERT INTO messages
    (seq, id, chat_jid, sender, sender_name, content, "timestamp", is_from_me, message_type, "metadata", stored_at)
    VALUES (COALESCE((SELECT MAX(seq) FROM messages), 0) + 1, :id, :chat_jid, :sender, :sender_name,
            :content, :timestamp, :is_from_me, :message_type, :metadata, {now})
    ON CONFLICT (id, chat_jid) DO NOTHING RETURNING seq{wake}"""
# ``stored_at``: the database's clock, as ``db.now_sql`` writes it on each backend.  On
# PostgreSQL the chat's wake-up goes in the same statement (store/chat_wakeups.py), only
# for a row stored; on SQLite it is noted on the connection for after the commit.
_INSERT_SQLITE = _INSERT.format(now="strftime('%Y-%m-%d %H:%M:%f', 'now')", wake="")
_INSERT_PG = _INSERT.format(now="now()", wake=f", {NOTIFY_RETURNING}")
_NAME_FILE = "INSERT INTO message_files (chat_jid, message_id, file_id) VALUES (:chat_jid, :message_id, :file_id)"
_MESSAGES = MessageRow.__table__
_STORED_FIELDS = (
    "seq",
    "id",
    "chat_jid",
    "sender",
    "sender_name",
    "content",
    "timestamp",
    "is_from_me",
    "message_type",
    "metadata",
    "superseded_at",
    "edited_at",
)
_EXISTING = select(_MESSAGES).where(_MESSAGES.c.id == bindparam("id"), _MESSAGES.c.chat_jid == bindparam("chat_jid"))


def insert_message(session: Session | Connection, db: Database, new: NewMessage) -> tuple[StoredMessage, bool]:
    """Insert inside the caller's transaction (an ORM session or a Core
    connection); returns (message, created).  A stored message wakes the chat's
    open streams when the transaction commits (store/chat_wakeups.py)."""
    _validate(new)
    new = _without_nul(_normalized(new))
    if isinstance(session, Session):
        session.flush()  # the caller's pending ORM changes first (a new group, say)
        conn = session.connection()
    else:
        conn = session
    # Lock first, then insert: on PostgreSQL two transactions storing the
    # same (id, chat_jid) at once queue on the lock, and the second one's
    # ON CONFLICT sees the first one's row.  (On SQLite the IMMEDIATE
    # transaction already serializes them.)
    _lock_seq(conn, db)
    fields = new.model_dump()
    # JSON as the column type would write it (json.dumps; None as JSON null).
    params = {**fields, "metadata": json.dumps(fields["metadata"])}
    row = driver_execute(conn, _INSERT_SQLITE if db.is_sqlite else _INSERT_PG, params).fetchone()
    if row is None:  # (id, chat_jid) is already stored: the first copy stands
        existing = conn.execute(_EXISTING, {"id": new.id, "chat_jid": new.chat_jid}).mappings().one()
        return StoredMessage(**{k: existing[k] for k in _STORED_FIELDS}), False
    if db.is_sqlite:
        chat_changed(conn, new.chat_jid)  # PostgreSQL's is in the INSERT
    files = files_of(new.metadata)
    if files is not None:
        # Which files it names, for retention (store/files.py: FileStore.prune).
        for file_id in dict.fromkeys(f.id for f in files.files):
            driver_execute(conn, _NAME_FILE, {"chat_jid": new.chat_jid, "message_id": new.id, "file_id": file_id})
    return StoredMessage(seq=row[0], **fields), True


def store_message_direct(*, db: Database, **fields: Any) -> StoredMessage:
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
    with db.write() as session:
        msg, _ = insert_message(session, db, new)
    return msg


def nth_last_live(session: Session, chat_jid: str, nth_last: int, *where: Any) -> MessageRow | None:
    """The ``nth_last`` (1: the newest) message of ``chat_jid`` that is not superseded and
    matches ``where``, in the caller's transaction (the agent's edits and reactions)."""
    return session.scalars(
        select(MessageRow)
        .where(MessageRow.chat_jid == chat_jid, MessageRow.superseded_at.is_(None), *where)
        .order_by(MessageRow.seq.desc())
        .offset(nth_last - 1)
        .limit(1)
    ).first()


def _first_error(exc: ValidationError) -> str:
    err = exc.errors()[0]
    where = ".".join(str(p) for p in err.get("loc", ())) or "message"
    return f"{where}: {err.get('msg', 'invalid')}"


def _live(stmt: Any, include_superseded: bool) -> Any:
    # Superseded messages (regenerate, truncate) stay for audit only.
    return stmt if include_superseded else stmt.where(_MESSAGES.c.superseded_at.is_(None))


def _read(db: Database, stmt: Any) -> list[StoredMessage]:
    # Plain rows, not ORM entities: half the cost of assembling a run's
    # input is otherwise ORM loading (docs/performance.md, history scale).
    with db.read() as session:
        return [StoredMessage(**{k: r[k] for k in _STORED_FIELDS}) for r in session.execute(stmt).mappings()]


def get_messages_since(
    chat_jid: str,
    since_timestamp: str | None = None,
    *,
    include_superseded: bool = False,
    db: Database,
) -> list[StoredMessage]:
    """A chat's messages with a timestamp after ``since_timestamp``, in seq order.

    Kept for compatibility with timestamp cursors; the pipeline itself uses
    :func:`get_messages_after` (seq cursor), which cannot lose equal-time rows.
    """
    c = _MESSAGES.c
    stmt = _live(select(_MESSAGES).where(c.chat_jid == chat_jid), include_superseded)
    if since_timestamp:
        # ISO-8601 text compares correctly only byte by byte: SQLite's default;
        # on PostgreSQL the database's collation (ICU en-US puts
        # "00.000001+00:00" before "00+00:00") must not decide.
        column = c.timestamp if db.is_sqlite else c.timestamp.collate("C")
        stmt = stmt.where(column > since_timestamp)
    return _read(db, stmt.order_by(c.seq))


def _of_chat(*, sqlite: bool) -> str:
    """The WHERE clause that picks one chat (``:chat_jid``), for the seq-ordered reads below.

    PostgreSQL's planner assumes a chat's messages are spread evenly over the
    table; for a chat with a large share of it, it then walks the table's own
    seq index (``messages_seq_key``) and filters on the chat, which for a chat
    that was busy long ago and is quiet now reads everything stored since its
    cursor (450k rows, 200+ ms in a 1M-message table; bench/history.py).
    Written as ``= ANY(ARRAY[jid])`` and ordered by (chat_jid, seq), only
    ``idx_messages_chat_seq`` gives the order, and with a LIMIT the planner
    takes that index scan, whose cost follows the rows it returns.
    SQLite always uses ``idx_messages_chat_seq`` for the plain equality.
    """
    return "chat_jid = :chat_jid" if sqlite else "chat_jid = ANY(ARRAY[CAST(:chat_jid AS text)])"


# The seq-ordered reads are fixed SQL on the driver, one statement per shape: the run
# path reads twice a run (its batch, the history before it), which through Core's
# statements and result rows cost ~0.5 ms of CPU each (docs/performance.md, "The control plane").
_COLUMNS = ", ".join(f'"{name}"' for name in _STORED_FIELDS)


@functools.cache
def _seq_read(*, sqlite: bool, newest: bool, bounded: bool, include_superseded: bool) -> str:
    """``newest``: below ``:seq``, newest first; else above it, oldest first.  ``bounded``:
    at most ``:limit`` rows."""
    live = "" if include_superseded else " AND superseded_at IS NULL"
    order = "chat_jid DESC, seq DESC" if newest else "chat_jid, seq"
    return (
        f"SELECT {_COLUMNS} FROM messages WHERE {_of_chat(sqlite=sqlite)} AND seq {'<' if newest else '>'} :seq"
        f"{live} ORDER BY {order}" + (" LIMIT :limit" if bounded else "")
    )


def _stored(values: tuple[Any, ...]) -> StoredMessage:
    """A :class:`StoredMessage` from the driver's own values of :data:`_STORED_FIELDS`
    (SQLite gives 0/1 for the flag, the JSON column's text and time columns as text)."""
    row = dict(zip(_STORED_FIELDS, values, strict=True))
    meta = row["metadata"]
    row["metadata"] = json.loads(meta) if isinstance(meta, str) else meta
    row["is_from_me"] = bool(row["is_from_me"])
    row["superseded_at"] = db_time(row["superseded_at"])
    row["edited_at"] = db_time(row["edited_at"])
    return StoredMessage(**row)


def _seq_rows(
    db: Database, chat_jid: str, seq: int, limit: int | None, *, newest: bool, include_superseded: bool
) -> list[StoredMessage]:
    sql = _seq_read(
        sqlite=db.is_sqlite, newest=newest, bounded=limit is not None, include_superseded=include_superseded
    )
    rows = db.read_fixed(sql, {"chat_jid": chat_jid, "seq": seq, "limit": limit})
    return [_stored(tuple(row)) for row in rows]


# Pages of an unlimited seq-ordered read on PostgreSQL (see _of_chat: a LIMIT
# keeps the planner on idx_messages_chat_seq).
_PAGE = 500


def get_messages_after(
    chat_jid: str,
    after_seq: int = 0,
    *,
    limit: int | None = None,
    include_superseded: bool = False,
    db: Database,
) -> list[StoredMessage]:
    """A chat's messages with ``seq > after_seq``, oldest first."""
    if db.is_sqlite:
        return _seq_rows(db, chat_jid, after_seq, limit, newest=False, include_superseded=include_superseded)
    out: list[StoredMessage] = []
    while limit is None or len(out) < limit:
        want = _PAGE if limit is None else min(_PAGE, limit - len(out))
        page = _seq_rows(db, chat_jid, after_seq, want, newest=False, include_superseded=include_superseded)
        out += page
        if len(page) < want:
            break
        after_seq = page[-1].seq
    return out


_WAITING_SINCE = {
    sqlite: f"SELECT MIN(stored_at) FROM messages WHERE {_of_chat(sqlite=sqlite)} AND seq > :after_seq "
    "AND seq <= :upto_seq AND is_from_me = :false"
    for sqlite in (True, False)
}


def waiting_since(db: Database, chat_jid: str, after_seq: int, upto_seq: int) -> datetime | None:
    """When the oldest message in ``(after_seq, upto_seq]`` not written by the assistant
    was stored (the database's clock): how long a run's batch waited.  None when
    none of them has a storing time (stored before revision 0012)."""
    rows = db.read_fixed(
        _WAITING_SINCE[db.is_sqlite],
        {"chat_jid": chat_jid, "after_seq": after_seq, "upto_seq": upto_seq, "false": False},
    )
    return db_time(rows[0][0])


def get_recent_messages(
    chat_jid: str,
    limit: int,
    *,
    before_seq: int | None = None,
    include_superseded: bool = False,
    db: Database,
) -> list[StoredMessage]:
    """The newest ``limit`` messages of a chat (below ``before_seq`` if given), oldest first."""
    # No bound: below a seq no message can have (seqs are positive 64-bit integers).
    below = before_seq if before_seq is not None else 2**62
    rows = _seq_rows(db, chat_jid, below, limit, newest=True, include_superseded=include_superseded)
    rows.reverse()
    return rows


def resolve_message(chat_jid: str, ref: str, *, db: Database) -> StoredMessage:
    """A message by id, or by ``#seq`` as ``orchestrator history`` prints it."""
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


def latest_seq(db: Database, chat_jid: str) -> int | None:
    """The chat's newest seq (superseded messages too; None: no message): an index lookup."""
    with db.read() as session:
        return session.scalar(select(func.max(MessageRow.seq)).where(MessageRow.chat_jid == chat_jid))


def change_marks(db: Database, chat_jid: str) -> tuple[datetime | None, datetime | None]:
    """The chat's latest ``superseded_at`` and ``edited_at``: when either moves, its history
    changed in place (an edit, a regenerate, a truncate)."""
    with db.read() as session:
        row = session.execute(
            select(func.max(MessageRow.superseded_at), func.max(MessageRow.edited_at)).where(
                MessageRow.chat_jid == chat_jid
            )
        ).one()
    return row[0], row[1]


def message_metadata(db: Database, chat_jid: str, seq: int) -> JsonObject | None:
    """The metadata of message ``seq`` of ``chat_jid`` (None: none, or no such message)."""
    with db.read() as session:
        return session.scalar(select(MessageRow.meta).where(MessageRow.chat_jid == chat_jid, MessageRow.seq == seq))


def run_replies(db: Database, chat_jid: str, run_id: str) -> int:
    """How many replies (``bot`` messages) run ``run_id`` stored in ``chat_jid``: a run's outputs
    have ids ``<run id>-...``."""
    with db.read() as session:
        count = session.scalar(
            select(func.count())
            .select_from(MessageRow)
            .where(MessageRow.chat_jid == chat_jid, MessageRow.id.like(f"{run_id}-%"), MessageRow.sender == SENDER_BOT)
        )
    return count or 0
