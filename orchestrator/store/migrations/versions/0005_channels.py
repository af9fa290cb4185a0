"""Channels attached to each group, and one delivery row per (message, channel).

Revision ID: 0005
Revises: 0004
Create Date: 2026-11-27
"""

import sqlalchemy as sa
from alembic import op

revision = "0005"
down_revision = "0004"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "group_channels",
        sa.Column("chat_jid", sa.Text(), nullable=False),
        sa.Column("channel", sa.String(64), nullable=False),
        sa.Column("address", sa.Text(), nullable=True),
        sa.Column("config", sa.JSON(), nullable=True),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.PrimaryKeyConstraint("chat_jid", "channel"),
    )
    op.create_table(
        "deliveries",
        sa.Column("id", sa.Integer(), autoincrement=True, nullable=False),
        sa.Column("message_seq", sa.Integer(), nullable=False),
        sa.Column("chat_jid", sa.Text(), nullable=False),
        sa.Column("channel", sa.String(64), nullable=False),
        sa.Column("address", sa.Text(), nullable=False),
        sa.Column("state", sa.String(16), nullable=False),
        sa.Column("attempts", sa.Integer(), nullable=False),
        sa.Column("next_attempt_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("claimed_by", sa.Text(), nullable=True),
        sa.Column("claimed_until", sa.DateTime(timezone=True), nullable=True),
        sa.Column("last_error", sa.Text(), nullable=True),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("sent_at", sa.DateTime(timezone=True), nullable=True),
        sa.PrimaryKeyConstraint("id"),
        sa.UniqueConstraint("message_seq", "channel", name="uq_deliveries_message_channel"),
    )
    op.create_index("idx_deliveries_due", "deliveries", ["state", "next_attempt_at"])
    op.create_index("idx_deliveries_line", "deliveries", ["chat_jid", "channel", "message_seq"])


def downgrade() -> None:
    op.drop_table("deliveries")
    op.drop_table("group_channels")
