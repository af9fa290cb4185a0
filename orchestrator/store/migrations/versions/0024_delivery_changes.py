"""What was sent where, and the changes to it (issue 34): ``deliveries.sent_ids`` and
``delivery_changes``.

* ``deliveries.sent_ids``: the channel's own ids of what a sent delivery posted, a JSON
  list (a Slack ``ts`` or Telegram ``message_id`` per post of a split reply, the webhook's
  delivery id); NULL for rows sent before this revision, and for channels that keep none.
* ``delivery_changes``: the outbox of edits and retractions of sent deliveries, claimed,
  retried and finished as the deliveries are (``orchestrator/store/delivery_changes.py``).

Revision ID: 0024
Revises: 0023
Create Date: 2026-11-29
"""

import sqlalchemy as sa
from alembic import op

revision = "0024"
down_revision = "0023"
branch_labels = None
depends_on = None

_UNFINISHED = "state IN ('pending', 'sending')"


def upgrade() -> None:
    with op.batch_alter_table("deliveries") as batch:
        batch.add_column(sa.Column("sent_ids", sa.JSON(), nullable=True))
    op.create_table(
        "delivery_changes",
        sa.Column("id", sa.Integer(), primary_key=True, autoincrement=True),
        sa.Column("delivery_id", sa.Integer(), nullable=False),
        sa.Column("chat_jid", sa.Text(), nullable=False),
        sa.Column("channel", sa.String(64), nullable=False),
        sa.Column("message_seq", sa.Integer(), nullable=False),
        sa.Column("kind", sa.String(16), nullable=False),
        sa.Column("state", sa.String(16), nullable=False),
        sa.Column("attempts", sa.Integer(), nullable=False),
        sa.Column("next_attempt_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("claimed_by", sa.Text(), nullable=True),
        sa.Column("claimed_until", sa.DateTime(timezone=True), nullable=True),
        sa.Column("last_error", sa.Text(), nullable=True),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("done_at", sa.DateTime(timezone=True), nullable=True),
    )
    op.create_index("idx_delivery_changes_due", "delivery_changes", ["state", "next_attempt_at"])
    op.create_index(
        "idx_delivery_changes_unfinished",
        "delivery_changes",
        ["delivery_id", "id"],
        postgresql_where=sa.text(_UNFINISHED),
        sqlite_where=sa.text(_UNFINISHED),
    )


def downgrade() -> None:
    op.drop_index("idx_delivery_changes_unfinished", table_name="delivery_changes")
    op.drop_index("idx_delivery_changes_due", table_name="delivery_changes")
    op.drop_table("delivery_changes")
    with op.batch_alter_table("deliveries") as batch:
        batch.drop_column("sent_ids")
