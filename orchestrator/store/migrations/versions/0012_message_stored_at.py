"""When each message was stored (issue 15, metrics): ``messages.stored_at``.

The database's clock at the insert (SQLite: UTC text with milliseconds;
PostgreSQL: ``now()``), so the time a message waited before a run took it and
the time from a message to its first reply are measured on the clock the
run's own times come from, whatever the sender wrote in ``timestamp``.
NULL for every message stored before this revision: they count in no wait.

Revision ID: 0012
Revises: 0011
Create Date: 2026-11-27
"""

import sqlalchemy as sa
from alembic import op

revision = "0012"
down_revision = "0011"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("messages") as batch:
        batch.add_column(sa.Column("stored_at", sa.DateTime(timezone=True), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("messages") as batch:
        batch.drop_column("stored_at")
