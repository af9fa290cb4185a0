"""Replays (issue 16, item 5): ``runs.replay_of`` and the ``replay_outputs`` table.

A replay runs a recorded run's exact input against another model in a scratch
copy of the group's workspace (orchestrator/run/replay.py).  It is a row of
``runs`` (its input recorded like any run's, its tokens counted against the
group's quotas) marked with the run it replays; what it said is kept in
``replay_outputs``, never in ``messages``.  NULL ``replay_of``: a chat run, as
every run stored before this revision.

Revision ID: 0015
Revises: 0014
Create Date: 2026-11-27
"""

import sqlalchemy as sa
from alembic import op

revision = "0015"
down_revision = "0014"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("runs") as batch:
        batch.add_column(sa.Column("replay_of", sa.String(36), nullable=True))
        batch.create_index("ix_runs_replay_of", ["replay_of"])
    op.create_table(
        "replay_outputs",
        sa.Column("run_id", sa.String(36), primary_key=True),
        sa.Column("model", sa.Text(), nullable=False),
        sa.Column("outputs_json", sa.LargeBinary(), nullable=True),
        sa.Column("copy_report", sa.JSON(), nullable=True),
    )


def downgrade() -> None:
    op.drop_table("replay_outputs")
    with op.batch_alter_table("runs") as batch:
        batch.drop_index("ix_runs_replay_of")
        batch.drop_column("replay_of")
