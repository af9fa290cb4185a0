"""The trace a message that woke the agent started (issue 15, traces): ``messages.traceparent``.

The W3C ``traceparent`` of the message's ``ingest`` span (or its scheduled task's),
written by ingest in the transaction that stores the message, only while tracing is
on and only for a message that wakes the agent.  A run's span joins the trace of the
first message of its batch that has one (orchestrator/run/run_trace.py), whichever
signal started the run: the database holds the context, not the broker.  NULL for
every other message, and for every message stored before this revision.

Revision ID: 0013
Revises: 0012
Create Date: 2026-11-27
"""

import sqlalchemy as sa
from alembic import op

revision = "0013"
down_revision = "0012"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("messages") as batch:
        batch.add_column(sa.Column("traceparent", sa.Text(), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("messages") as batch:
        batch.drop_column("traceparent")
