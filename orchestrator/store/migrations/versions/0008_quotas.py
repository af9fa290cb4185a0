"""Quotas and rate limits (issue 14): a group's own quotas, the senders' recent
messages, and an index for counting a group's recent runs.

* ``groups.runs_per_hour``, ``groups.tokens_per_day``: the group's quotas;
  NULL (every existing group) means the settings' defaults, 0 no limit.
* ``sender_hits``: one row per message a person sent through ingest while
  ``ORCHESTRATOR_SENDER_MESSAGES_PER_MINUTE`` is on, stamped with the
  database's clock (the message's own ``timestamp`` is the sender's claim);
  a sender's rows older than the window are deleted as new ones come.
* ``idx_runs_chat_created``: runs of one group by start, for "runs in the
  last hour" and "tokens today".

Revision ID: 0008
Revises: 0007
Create Date: 2026-11-29
"""

import sqlalchemy as sa
from alembic import op

revision = "0008"
down_revision = "0007"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("groups") as batch:
        batch.add_column(sa.Column("runs_per_hour", sa.Integer(), nullable=True))
        batch.add_column(sa.Column("tokens_per_day", sa.Integer(), nullable=True))
    op.create_table(
        "sender_hits",
        sa.Column("id", sa.Integer(), autoincrement=True, nullable=False),
        sa.Column("chat_jid", sa.Text(), nullable=False),
        sa.Column("sender", sa.Text(), nullable=False),
        sa.Column("at", sa.DateTime(timezone=True), nullable=False),
        sa.PrimaryKeyConstraint("id"),
    )
    op.create_index("idx_sender_hits_window", "sender_hits", ["chat_jid", "sender", "at"])
    op.create_index("idx_runs_chat_created", "runs", ["chat_jid", "created_at"])


def downgrade() -> None:
    op.drop_index("idx_runs_chat_created", table_name="runs")
    op.drop_table("sender_hits")
    with op.batch_alter_table("groups") as batch:
        batch.drop_column("tokens_per_day")
        batch.drop_column("runs_per_hour")
