"""Initial schema: messages, groups, runs.

Revision ID: 0001
Revises:
Create Date: 2026-11-26
"""

import sqlalchemy as sa
from alembic import op

from orchestrator.store.migrations import legacy

revision = "0001"
down_revision = None
branch_labels = None
depends_on = None


def upgrade() -> None:
    # No alembic_version yet but a messages table: a legacy (pre-Alembic)
    # database.  Its tables are set aside, ours created, its messages copied.
    bind = op.get_bind()
    upgrading_legacy = sa.inspect(bind).has_table("messages")
    if upgrading_legacy:
        legacy.set_aside(bind)
    op.create_table(
        "messages",
        sa.Column("id", sa.Text(), nullable=False),
        sa.Column("chat_jid", sa.Text(), nullable=False),
        sa.Column("seq", sa.Integer(), nullable=False),
        sa.Column("sender", sa.Text(), nullable=False),
        sa.Column("sender_name", sa.Text(), nullable=False),
        sa.Column("content", sa.Text(), nullable=False),
        sa.Column("timestamp", sa.Text(), nullable=False),
        sa.Column("is_from_me", sa.Boolean(), nullable=False),
        sa.Column("message_type", sa.Text(), server_default="user", nullable=False),
        sa.Column("metadata", sa.JSON(), nullable=True),
        sa.PrimaryKeyConstraint("id", "chat_jid"),
        sa.UniqueConstraint("seq"),
    )
    op.create_index("idx_messages_by_chat", "messages", ["chat_jid", "timestamp"])
    op.create_index("idx_messages_chat_seq", "messages", ["chat_jid", "seq"])
    op.create_table(
        "groups",
        sa.Column("chat_jid", sa.Text(), nullable=False),
        sa.Column("name", sa.Text(), nullable=False),
        sa.Column("folder", sa.Text(), nullable=False),
        sa.Column("is_main", sa.Boolean(), nullable=False),
        sa.Column("requires_trigger", sa.Boolean(), nullable=False),
        sa.Column("assistant_name", sa.Text(), nullable=True),
        sa.Column("container_config", sa.JSON(), nullable=True),
        sa.Column("cursor_seq", sa.Integer(), nullable=False),
        sa.Column("pending_seq", sa.Integer(), nullable=False),
        sa.Column("lease_owner", sa.Text(), nullable=True),
        sa.Column("lease_expires_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("session_id", sa.Text(), nullable=True),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.PrimaryKeyConstraint("chat_jid"),
        sa.UniqueConstraint("folder"),
    )
    op.create_table(
        "runs",
        sa.Column("id", sa.String(36), nullable=False),
        sa.Column("chat_jid", sa.Text(), nullable=False),
        sa.Column("state", sa.String(16), nullable=False),
        sa.Column("attempts", sa.Integer(), nullable=False),
        sa.Column("cursor_from", sa.Integer(), nullable=False),
        sa.Column("cursor_to", sa.Integer(), nullable=False),
        sa.Column("celery_task_id", sa.Text(), nullable=True),
        sa.Column("container_id", sa.Text(), nullable=True),
        sa.Column("input_tokens", sa.Integer(), nullable=False),
        sa.Column("output_tokens", sa.Integer(), nullable=False),
        sa.Column("error", sa.Text(), nullable=True),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("started_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("finished_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("duration_s", sa.Float(), nullable=True),
        sa.PrimaryKeyConstraint("id"),
    )
    op.create_index("ix_runs_chat_jid", "runs", ["chat_jid"])
    op.create_index("ix_runs_state", "runs", ["state"])
    if upgrading_legacy:
        legacy.copy_messages(bind)


def downgrade() -> None:
    op.drop_table("runs")
    op.drop_table("groups")
    op.drop_index("idx_messages_chat_seq", table_name="messages")
    op.drop_index("idx_messages_by_chat", table_name="messages")
    op.drop_table("messages")
