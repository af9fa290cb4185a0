"""Reactions (issue 34): ``reactions`` and the ``react`` changes of ``delivery_changes``.

* ``reactions``: one emoji put on one message of a chat by one reactor (the agent is
  ``bot``), once: the table the page's badges and the channels' reactions come from.
* ``delivery_changes``: a ``react`` change names its reaction (``reaction_id``); one for
  the channel a person's message came from has no delivery of ours to name
  (``delivery_id`` NULL) and keeps the channel's ``address`` instead.

Revision ID: 0025
Revises: 0024
Create Date: 2026-11-28
"""

import sqlalchemy as sa
from alembic import op

revision = "0025"
down_revision = "0024"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "reactions",
        sa.Column("id", sa.Integer(), primary_key=True, autoincrement=True),
        sa.Column("chat_jid", sa.Text(), nullable=False),
        sa.Column("message_seq", sa.Integer(), nullable=False),
        sa.Column("emoji", sa.String(32), nullable=False),
        sa.Column("sender", sa.Text(), nullable=False),
        sa.Column("run_id", sa.Text(), nullable=True),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.UniqueConstraint("chat_jid", "message_seq", "emoji", "sender", name="uq_reactions_once"),
    )
    op.create_index("idx_reactions_chat", "reactions", ["chat_jid", "id"])
    with op.batch_alter_table("delivery_changes") as batch:
        batch.alter_column("delivery_id", existing_type=sa.Integer(), nullable=True)
        batch.add_column(sa.Column("reaction_id", sa.Integer(), nullable=True))
        batch.add_column(sa.Column("address", sa.Text(), nullable=True))


def downgrade() -> None:
    op.execute("DELETE FROM delivery_changes WHERE delivery_id IS NULL")
    with op.batch_alter_table("delivery_changes") as batch:
        batch.drop_column("address")
        batch.drop_column("reaction_id")
        batch.alter_column("delivery_id", existing_type=sa.Integer(), nullable=False)
    op.drop_index("idx_reactions_chat", table_name="reactions")
    op.drop_table("reactions")
