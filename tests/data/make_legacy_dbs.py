"""Write the legacy SQLite databases the upgrade tests start from.

``legacy_v1.db``: the single-process assistant's first schema (messages without
``message_type`` and ``metadata``).  ``legacy_v2.db``: its later schema, with
both.  Neither has ``seq`` or ``alembic_version``.  Only the sqlite3 standard
library module and the legacy DDL are used, so the files are what that system
wrote.  Run ``python tests/data/make_legacy_dbs.py`` to regenerate them (the
tests check the committed files still match this script).
"""

from __future__ import annotations

import sqlite3
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent

GROUP = "120363000000000001@g.us"
DM = "15551234567@s.whatsapp.net"
ALICE = "15551234567@s.whatsapp.net"
BOB = "15559876543@s.whatsapp.net"

LEGACY_DDL = """
CREATE TABLE chats (jid TEXT PRIMARY KEY, name TEXT, last_message_time TEXT);
CREATE TABLE messages (id TEXT, chat_jid TEXT, sender TEXT, sender_name TEXT, content TEXT, timestamp TEXT,
  is_from_me INTEGER, PRIMARY KEY (id, chat_jid), FOREIGN KEY (chat_jid) REFERENCES chats(jid));
CREATE INDEX idx_timestamp ON messages(timestamp);
CREATE TABLE scheduled_tasks (id TEXT PRIMARY KEY, group_folder TEXT NOT NULL, chat_jid TEXT NOT NULL,
  prompt TEXT NOT NULL, schedule_type TEXT NOT NULL, schedule_value TEXT NOT NULL, next_run TEXT, last_run TEXT,
  last_result TEXT, status TEXT DEFAULT 'active', created_at TEXT NOT NULL);
CREATE TABLE router_state (key TEXT PRIMARY KEY, value TEXT NOT NULL);
"""
# The later legacy schema added these two columns to messages.
V2_COLUMNS = """
ALTER TABLE messages ADD COLUMN message_type TEXT NOT NULL DEFAULT 'user';
ALTER TABLE messages ADD COLUMN metadata TEXT;
"""

CHATS = [
    (GROUP, "Family", "2024-03-01T10:03:00.000Z"),
    (DM, "Alice", "2024-03-01T10:08:00.000Z"),
]

# In insertion (rowid) order, which is deliberately not timestamp order.
# (id, chat_jid, sender, sender_name, content, timestamp, is_from_me, v2 message_type, v2 metadata)
# A v2 message_type of None is left out of the INSERT (the column's DEFAULT 'user' applies).
MESSAGES = [
    ("m01", GROUP, ALICE, "Alice", "@Andy what's the weather?", "2024-03-01T10:00:00.000Z", 0, "user", None),
    ("m02", GROUP, "bot", "Andy", "Sunny, 18°C.", "2024-03-01T10:00:05.000Z", 1, "assistant", '{"model": "claude"}'),
    ("m04", GROUP, "command_output", "", "$ uptime\n up 3 days", "2024-03-01T10:01:00.000Z", 1, "",
     '{"exit_code": 0}'),
    ("m03", GROUP, "host", "host", "Container started", "2024-03-01T10:00:30.000Z", 1, "", None),
    ("m05", GROUP, "system", "system", "Group renamed", "2024-03-01T10:02:00.000Z", 0, "system", "not json{"),
    ("m07b", GROUP, BOB, None, None, "2024-03-01T10:03:00.000Z", None, None, None),
    ("m07a", GROUP, ALICE, "Alice", "same second", "2024-03-01T10:03:00.000Z", 0, "user", "[1, 2]"),
    ("m06", DM, ALICE, "Alice", "hi in private", "2024-03-01T10:02:30.000Z", 0, "", ""),
    ("m08", DM, "bot", "Andy", "hello Alice", "2024-03-01T10:04:00.000Z", 1, "assistant", None),
    ("m09", DM, "host", None, "Session reset", "2024-03-01T10:05:00.000Z", 1, "", None),
    ("m10", DM, "command_output", "", "ls: cannot access 'x'", "2024-03-01T10:06:00.000Z", 1, "tool_result",
     '{"exit_code": 2}'),
    ("m11", DM, "system", "system", "Scheduled task ran", "2024-03-01T10:07:00.000Z", 0, "host", None),
    ("m12", DM, ALICE, "Alice", "👍", "2024-03-01T10:08:00.000Z", 0, "reaction", None),
    ("m01", DM, ALICE, "Alice", "same id, other chat", "2024-03-01T09:59:00.000Z", 0, "user", None),
]

SCHEDULED_TASKS = [
    ("task-1", "family", GROUP, "Send a morning summary", "cron", "0 9 * * *", "2024-03-02T09:00:00.000Z", None,
     None, "active", "2024-02-28T12:00:00.000Z"),
]

ROUTER_STATE = [
    ("last_timestamp", "2024-03-01T10:08:00.000Z"),
    ("last_agent_timestamp", '{"' + GROUP + '": "2024-03-01T10:00:05.000Z"}'),
]


def make(path: Path, *, v2: bool) -> None:
    path.unlink(missing_ok=True)
    conn = sqlite3.connect(path)
    try:
        conn.executescript(LEGACY_DDL + (V2_COLUMNS if v2 else ""))
        conn.executemany("INSERT INTO chats VALUES (?, ?, ?)", CHATS)
        for *base, message_type, metadata in MESSAGES:
            if not v2:
                conn.execute("INSERT INTO messages VALUES (?, ?, ?, ?, ?, ?, ?)", base)
            elif message_type is None:
                conn.execute(
                    "INSERT INTO messages (id, chat_jid, sender, sender_name, content, timestamp, is_from_me, "
                    "metadata) VALUES (?, ?, ?, ?, ?, ?, ?, ?)", (*base, metadata))
            else:
                conn.execute("INSERT INTO messages VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)",
                             (*base, message_type, metadata))
        conn.executemany("INSERT INTO scheduled_tasks VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)", SCHEDULED_TASKS)
        conn.executemany("INSERT INTO router_state VALUES (?, ?)", ROUTER_STATE)
        conn.commit()
        conn.execute("VACUUM")
    finally:
        conn.close()


def main(out_dir: Path = HERE) -> None:
    make(out_dir / "legacy_v1.db", v2=False)
    make(out_dir / "legacy_v2.db", v2=True)


if __name__ == "__main__":
    main(Path(sys.argv[1]) if len(sys.argv) > 1 else HERE)
