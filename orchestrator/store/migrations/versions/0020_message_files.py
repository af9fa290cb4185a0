"""Which messages name which files (issue 31, retention): the ``message_files`` table.

A row per file a message's FILE envelope names, written with the message
(store/message_log.py), so that a file no live message names can be found and
freed (store/files.py: ``FileStore.prune``).  Messages stored before this revision
are read once here and their rows written.

Revision ID: 0020
Revises: 0019
Create Date: 2026-11-28
"""

import json

import sqlalchemy as sa
from alembic import op

revision = "0020"
down_revision = "0019"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "message_files",
        sa.Column("chat_jid", sa.Text(), primary_key=True),
        sa.Column("message_id", sa.Text(), primary_key=True),
        sa.Column("file_id", sa.String(64), primary_key=True),
    )
    op.create_index("ix_message_files_file_id", "message_files", ["file_id"])
    conn = op.get_bind()
    rows = conn.execute(
        sa.text(
            "SELECT chat_jid, id, metadata FROM messages WHERE metadata IS NOT NULL AND CAST(metadata AS TEXT) LIKE :like"
        ),
        {"like": '%"FILE"%'},
    )
    named = []
    for chat_jid, message_id, raw in rows:
        meta = json.loads(raw) if isinstance(raw, str) else raw
        if not isinstance(meta, dict) or meta.get("message_type") != "FILE":
            continue
        files = (meta.get("payload") or {}).get("files") or []
        for file_id in dict.fromkeys(f.get("id") for f in files if isinstance(f, dict)):
            if isinstance(file_id, str):
                named.append({"chat_jid": chat_jid, "message_id": message_id, "file_id": file_id})
    if named:
        conn.execute(
            sa.text(
                "INSERT INTO message_files (chat_jid, message_id, file_id) VALUES (:chat_jid, :message_id, :file_id)"
            ),
            named,
        )


def downgrade() -> None:
    op.drop_index("ix_message_files_file_id", table_name="message_files")
    op.drop_table("message_files")
