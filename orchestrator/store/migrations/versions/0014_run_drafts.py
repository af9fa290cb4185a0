"""Streamed replies (issue 16, item 3): the ``run_drafts`` table.

One row per running run whose model is writing a reply: the text so far,
written in place at most every 100 ms by the worker that runs it
(orchestrator/run/live_draft.py), read by the chat's event stream in the
API process (orchestrator/http/stream.py), deleted when the reply is stored
as a message or the run ends.  Nothing here is kept: a reply is stored once,
complete, in ``messages``.

Revision ID: 0014
Revises: 0013
Create Date: 2026-11-27
"""

import sqlalchemy as sa
from alembic import op

revision = "0014"
down_revision = "0013"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "run_drafts",
        sa.Column("run_id", sa.String(36), nullable=False),
        sa.Column("chat_jid", sa.Text(), nullable=False),
        sa.Column("text", sa.Text(), nullable=False),
        sa.Column("version", sa.Integer(), nullable=False),
        sa.Column("updated_at", sa.DateTime(timezone=True), nullable=False),
        sa.PrimaryKeyConstraint("run_id"),
    )
    op.create_index("ix_run_drafts_chat_jid", "run_drafts", ["chat_jid"])


def downgrade() -> None:
    op.drop_index("ix_run_drafts_chat_jid", table_name="run_drafts")
    op.drop_table("run_drafts")
