"""A run that failed and waits for its next attempt says when: ``retry_at``.

Retries are scheduled (the group's signal carries a countdown, the sweeper
is the backstop), never slept inside a worker slot (issue 14).  The run stays
``queued`` with ``retry_at`` set and no lease held meanwhile.

Revision ID: 0007
Revises: 0006
Create Date: 2026-11-26
"""

import sqlalchemy as sa
from alembic import op

revision = "0007"
down_revision = "0006"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("runs") as batch:
        batch.add_column(sa.Column("retry_at", sa.DateTime(timezone=True), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("runs") as batch:
        batch.drop_column("retry_at")
