"""Failure detection in seconds (issue 37): ``process_liveness`` and ``groups.lease_renewed_at``.

* ``process_liveness``: per worker process (host id, pid), a token others can test to tell
  whether it still runs from any host: a PostgreSQL session it keeps open
  (``pg:<backend pid>:<backend start>``, gone from ``pg_stat_activity`` the moment its
  process dies), or, on SQLite's one machine, a file it holds an ``flock`` on.
* ``groups.lease_renewed_at``: when the lease holder last took or renewed it (the
  database's clock): a holder whose process is gone is taken over only once it has also
  stopped renewing.

Revision ID: 0026
Revises: 0025
Create Date: 2026-11-28
"""

import sqlalchemy as sa
from alembic import op

revision = "0026"
down_revision = "0025"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "process_liveness",
        sa.Column("host_id", sa.Text(), primary_key=True),
        sa.Column("pid", sa.Integer(), primary_key=True),
        sa.Column("token", sa.Text(), nullable=False),
        sa.Column("registered_at", sa.DateTime(timezone=True), nullable=False),
    )
    with op.batch_alter_table("groups") as batch:
        batch.add_column(sa.Column("lease_renewed_at", sa.DateTime(timezone=True), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("groups") as batch:
        batch.drop_column("lease_renewed_at")
    op.drop_table("process_liveness")
