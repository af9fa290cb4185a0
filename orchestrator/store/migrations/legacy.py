"""Upgrade a legacy (pre-Alembic) database in place.

The single-process assistant this orchestrator replaces kept its messages in
SQLite without ``seq`` (its first schema also lacked ``message_type`` and
``metadata``), beside ``chats``, ``router_state`` and a ``scheduled_tasks``
table of its own.  Revision 0001 finds such a ``messages`` table (no
``alembic_version`` yet, so 0001 is running) and calls :func:`set_aside`
before creating our tables and :func:`copy_messages` after, so an upgraded
database ends with exactly the schema a fresh one gets.  ``chats`` and
``router_state`` are left as they are; the legacy ``scheduled_tasks`` is kept
as ``legacy_scheduled_tasks`` so 0003 can create ours.

Written with SQLAlchemy Core, so a legacy table on PostgreSQL upgrades too
(there, rows with equal timestamps are ordered by chat and id: no rowid).
This module is part of the migration history: it must not import the
application's current code.
"""

from __future__ import annotations

import json
import logging
from typing import Any, TypedDict

import sqlalchemy as sa
from alembic import op

log = logging.getLogger(__name__)

# The legacy messages table while its rows are copied (dropped afterwards).
OLD_MESSAGES = "legacy_messages_upgrading"
LEGACY_SCHEDULED_TASKS = "legacy_scheduled_tasks"

# The message types of revision 0001.
_MESSAGE_TYPES = frozenset({"user", "assistant", "system", "tool_result", "host"})
# What the legacy system's senders meant; any other sender is a person.
_TYPE_BY_SENDER = {"host": "host", "command_output": "tool_result", "bot": "assistant", "system": "system"}
_BATCH = 1000


def set_aside(conn: sa.Connection) -> None:
    """Rename the legacy tables that ours would collide with (before 0001 creates messages)."""
    insp = sa.inspect(conn)
    _rename(conn, insp, "messages", OLD_MESSAGES)
    if insp.has_table("scheduled_tasks"):
        _rename(conn, insp, "scheduled_tasks", LEGACY_SCHEDULED_TASKS)
        log.info("legacy upgrade: kept the legacy scheduled_tasks table as %s", LEGACY_SCHEDULED_TASKS)


def copy_messages(conn: sa.Connection) -> int:
    """Copy the set-aside legacy messages into our (new, empty) messages table; returns the count.

    ``seq`` follows (timestamp, rowid): the legacy system's own read order.
    """
    columns = {c["name"] for c in sa.inspect(conn).get_columns(OLD_MESSAGES)}
    read = [
        n
        for n in (
            "id",
            "chat_jid",
            "sender",
            "sender_name",
            "content",
            "timestamp",
            "is_from_me",
            "message_type",
            "metadata",
        )
        if n in columns
    ]
    old = sa.table(OLD_MESSAGES, *(sa.column(n) for n in read))
    if conn.dialect.name == "sqlite":
        order: list[sa.ColumnElement[Any]] = [old.c.timestamp, sa.literal_column("rowid")]
    else:
        # Byte order, as SQLite compares text (not the database's collation).
        order = [old.c.timestamp.collate("C"), old.c.chat_jid, old.c.id]
    new = sa.table(
        "messages",
        *(
            sa.column(n)
            for n in ("id", "chat_jid", "seq", "sender", "sender_name", "content", "timestamp", "message_type")
        ),
        sa.column("is_from_me", sa.Boolean()),
        sa.column("metadata", sa.JSON(none_as_null=True)),
    )
    # Fetch everything before writing: one cursor at a time on the connection.
    rows = conn.execute(sa.select(*(old.c[n] for n in read)).order_by(*order)).mappings().all()
    for start in range(0, len(rows), _BATCH):
        batch = rows[start : start + _BATCH]
        conn.execute(new.insert(), [convert(row, seq) for seq, row in enumerate(batch, start + 1)])
    op.drop_table(OLD_MESSAGES)
    log.info("legacy upgrade: copied %d messages into the new messages table (seq 1..%d)", len(rows), len(rows))
    return len(rows)


# The legacy metadata: whatever JSON object the old system kept (its keys are
# open; the values are only copied).
_LegacyMetadata = dict[str, object]


class NewMessageRow(TypedDict):
    """A row of our ``messages`` table (revision 0001's columns), as the upgrade inserts it."""

    id: str
    chat_jid: str
    seq: int
    sender: str
    sender_name: str
    content: str
    timestamp: str
    is_from_me: bool
    message_type: str
    metadata: _LegacyMetadata | None


def convert(row: Any, seq: int) -> NewMessageRow:
    """One legacy row (a mapping of the columns it has) as a row of our messages table."""
    sender = _text(row.get("sender"))
    metadata = _metadata(row.get("metadata"))
    message_type = row.get("message_type")
    if message_type not in _MESSAGE_TYPES:
        if message_type:  # a type we do not know: backfilled like a missing one, kept on record
            metadata = {**(metadata or {}), "legacy_message_type": message_type}
        message_type = _TYPE_BY_SENDER.get(sender, "user")
    elif message_type == "user" and sender in _TYPE_BY_SENDER:
        # 'user' was the legacy column's DEFAULT: rows older than the column
        # (bot replies included) got it, so a harness sender says more.
        message_type = _TYPE_BY_SENDER[sender]
    return {
        "id": _text(row.get("id")) or f"legacy-{seq}",
        "chat_jid": _text(row.get("chat_jid")),
        "seq": seq,
        "sender": sender,
        "sender_name": _text(row.get("sender_name")),
        "content": _text(row.get("content")),
        "timestamp": _text(row.get("timestamp")),
        "is_from_me": _flag(row.get("is_from_me")),
        "message_type": message_type,
        "metadata": metadata,
    }


def _rename(conn: sa.Connection, insp: sa.Inspector, old: str, new: str) -> None:
    pk = insp.get_pk_constraint(old).get("name")
    op.rename_table(old, new)
    if conn.dialect.name == "postgresql" and pk:
        # The primary key's index keeps its name ("messages_pkey"), which the
        # table we are about to create needs.
        quote = conn.dialect.identifier_preparer.quote
        op.execute(sa.text(f"ALTER INDEX {quote(pk)} RENAME TO {quote(new + '_pkey')}"))


def _text(value: Any) -> str:
    return "" if value is None else str(value)


def _flag(value: Any) -> bool:
    if isinstance(value, str):
        return value.strip().lower() in ("1", "true", "t", "yes")
    return bool(value)


def _metadata(value: Any) -> _LegacyMetadata | None:
    """The legacy metadata as a JSON object; anything else is kept as {"legacy_metadata": text}."""
    if value is None or value == "":
        return None
    if isinstance(value, dict):  # a JSON column (PostgreSQL) is already parsed
        return value
    if isinstance(value, str):
        try:
            parsed = json.loads(value)
        except ValueError:
            parsed = None
        if isinstance(parsed, dict):
            return parsed
        return {"legacy_metadata": value}
    return {"legacy_metadata": json.dumps(value)}
