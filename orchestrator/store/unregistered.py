"""What is kept of chats that are no registered group: the messages table's side of
ingest's bounds (``orchestrator/run/ingest.py`` decides, with the settings'
``ORCHESTRATOR_UNREGISTERED_CHATS`` and ``ORCHESTRATOR_UNREGISTERED_CHAT_MESSAGES``).

Each runs in ingest's transaction (a Core connection), after the message was inserted
and under the write lock the insert holds (SQLite's, or the message-seq lock on
PostgreSQL), so concurrent first messages of new chats are counted one after another.
Fixed statements on the driver: ingest is the hot path (docs/performance.md).
"""

from __future__ import annotations

from sqlalchemy import Connection

from orchestrator.store.db import driver_execute

# Whether the chat had a message before this one (an index probe on (chat_jid, seq)).
_KEPT_BEFORE = "SELECT 1 FROM messages WHERE chat_jid = :chat_jid AND seq < :seq LIMIT 1"
# The other chats with messages and no group, counted up to :limit.  The messages table
# has no list of its chats: a loose index scan over (chat_jid, seq) walks them one probe
# each (the chats of registered groups too), never the messages; it runs only for a new
# unregistered chat's first message, and the cap bounds what it walks.
_OTHER_UNREGISTERED = """WITH RECURSIVE chats(jid) AS (
        SELECT MIN(chat_jid) FROM messages
        UNION ALL
        SELECT (SELECT MIN(m.chat_jid) FROM messages m WHERE m.chat_jid > chats.jid)
        FROM chats WHERE chats.jid IS NOT NULL)
    SELECT COUNT(*) FROM (
        SELECT jid FROM chats
        WHERE jid IS NOT NULL AND jid <> :chat_jid
          AND NOT EXISTS (SELECT 1 FROM groups g WHERE g.chat_jid = chats.jid)
        LIMIT :limit) AS kept"""
# The chat's messages older than its :older + 1 newest (none while it has fewer).
_PRUNE = """DELETE FROM messages WHERE chat_jid = :chat_jid AND seq < (
        SELECT seq FROM messages WHERE chat_jid = :chat_jid ORDER BY seq DESC LIMIT 1 OFFSET :older)"""


def kept_before(conn: Connection, chat_jid: str, seq: int) -> bool:
    """Whether ``chat_jid`` has a message below ``seq``: a chat kept already, not a new one."""
    return driver_execute(conn, _KEPT_BEFORE, {"chat_jid": chat_jid, "seq": seq}).fetchone() is not None


def other_unregistered_chats(conn: Connection, chat_jid: str, limit: int) -> int:
    """How many chats other than ``chat_jid`` have messages and no group, counted up to ``limit``."""
    count: int = driver_execute(conn, _OTHER_UNREGISTERED, {"chat_jid": chat_jid, "limit": limit}).fetchone()[0]
    return count


def keep_newest(conn: Connection, chat_jid: str, keep: int) -> None:
    """Delete ``chat_jid``'s messages but its ``keep`` newest (``keep`` at least 1)."""
    driver_execute(conn, _PRUNE, {"chat_jid": chat_jid, "older": keep - 1})
