"""Tasks the agent made itself (issue 32, schedule tools): ``scheduled_tasks.made_by_agent``.

A task the agent scheduled through its tools is marked, so people can tell it from one an
operator made (a prompt injection may try to persist through one): the CLI, the API and the
agent's own list show it, and the group's cap on such tasks counts them.

Revision ID: 0022
Revises: 0021
Create Date: 2026-11-28
"""

import sqlalchemy as sa
from alembic import op

revision = "0022"
down_revision = "0021"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("scheduled_tasks") as batch:
        batch.add_column(sa.Column("made_by_agent", sa.Boolean(), nullable=False, server_default=sa.false()))


def downgrade() -> None:
    with op.batch_alter_table("scheduled_tasks") as batch:
        batch.drop_column("made_by_agent")
