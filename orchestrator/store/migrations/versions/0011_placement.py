"""Placement (issue 14): the host a group's runs go to.

``groups.placed_host``: the host id of the worker host the group is placed
on (``orchestrator/store/placement.py``): the host that took its lease when
it had no live place, or the one ``orchestrator groups move`` named.  Its
signals go to that host's own queue while the host is up and beating;
NULL (every existing group) means no place yet: the shared queue.

Revision ID: 0011
Revises: 0010
Create Date: 2026-12-01
"""

import sqlalchemy as sa
from alembic import op

revision = "0011"
down_revision = "0010"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("groups") as batch:
        batch.add_column(sa.Column("placed_host", sa.Text(), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("groups") as batch:
        batch.drop_column("placed_host")
