"""Volume holds (issue 29): which host may have a group's volumes mounted.

A group's workspace (and session folder) volume is an ext4 image in the data
dir, which a fleet shares between machines; two machines loop-mounting the
same image at once corrupt it.  ``volume_holds`` says which host holds a
group's volumes: only that host mounts them, and another host takes them only
once the holder let go (it unmounts when the group moves) or has been gone for
good (orchestrator/store/volume_holds.py).

Revision ID: 0018
Revises: 0017
Create Date: 2026-11-27
"""

import sqlalchemy as sa
from alembic import op

revision = "0018"
down_revision = "0017"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "volume_holds",
        sa.Column("folder", sa.Text(), primary_key=True),
        sa.Column("host_id", sa.Text(), nullable=False),
        sa.Column("held_at", sa.DateTime(timezone=True), nullable=False),
    )
    op.create_index("ix_volume_holds_host_id", "volume_holds", ["host_id"])


def downgrade() -> None:
    op.drop_index("ix_volume_holds_host_id", table_name="volume_holds")
    op.drop_table("volume_holds")
