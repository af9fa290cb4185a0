"""The fleet's run cap (issue 14): the groups waiting for a free slot.

``run_waits``: one row per group whose next run could not start because
``ORCHESTRATOR_MAX_CONCURRENT_RUNS`` runs were unfinished (or waiting groups
ranked above it took the free ones): since when it waits and when it last
asked, both on the database's clock (``orchestrator/store/slots.py``).  The
row goes when the group's run is admitted.

Revision ID: 0010
Revises: 0009
Create Date: 2026-11-30
"""

import sqlalchemy as sa
from alembic import op

revision = "0010"
down_revision = "0009"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "run_waits",
        sa.Column("chat_jid", sa.Text(), nullable=False),
        sa.Column("since", sa.DateTime(timezone=True), nullable=False),
        sa.Column("seen_at", sa.DateTime(timezone=True), nullable=False),
        sa.PrimaryKeyConstraint("chat_jid"),
    )


def downgrade() -> None:
    op.drop_table("run_waits")
