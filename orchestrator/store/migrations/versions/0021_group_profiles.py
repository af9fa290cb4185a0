"""A profile per group (issue 32): its own model, output cap, thinking budget, trigger
names and optional tools, each NULL (every existing group) for the installation's.

* ``groups.model``: ``provider:model`` as ``ORCHESTRATOR_MODEL`` spells it;
* ``groups.max_tokens``, ``groups.thinking_budget``: as ``ORCHESTRATOR_MAX_TOKENS`` and
  ``ORCHESTRATOR_THINKING_BUDGET``;
* ``groups.trigger_names``: a JSON list of names that replace the installation's
  (``ORCHESTRATOR_ASSISTANT_NAME`` and ``ORCHESTRATOR_TRIGGER_ALIASES``) for the group;
* ``groups.tools``: a JSON list of the optional tools the group's agent has.

Revision ID: 0021
Revises: 0020
Create Date: 2026-11-29
"""

import sqlalchemy as sa
from alembic import op

revision = "0021"
down_revision = "0020"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("groups") as batch:
        batch.add_column(sa.Column("model", sa.Text(), nullable=True))
        batch.add_column(sa.Column("max_tokens", sa.Integer(), nullable=True))
        batch.add_column(sa.Column("thinking_budget", sa.Integer(), nullable=True))
        batch.add_column(sa.Column("trigger_names", sa.JSON(), nullable=True))
        batch.add_column(sa.Column("tools", sa.JSON(), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("groups") as batch:
        batch.drop_column("tools")
        batch.drop_column("trigger_names")
        batch.drop_column("thinking_budget")
        batch.drop_column("max_tokens")
        batch.drop_column("model")
