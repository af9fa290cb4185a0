"""The machine a host runs on (issue 45): ``hosts.machine``, its machine id and boot id.

Hosts on one machine share its kernel and so its loop mounts: a live host may take a
dead one's group volumes over at once (``orchestrator/store/volume_holds.py``).  NULL for
a row written before (it is written again at the host's next start).

Revision ID: 0028
Revises: 0027
Create Date: 2026-12-07
"""

import sqlalchemy as sa
from alembic import op

revision = "0028"
down_revision = "0027"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("hosts") as batch:
        batch.add_column(sa.Column("machine", sa.Text(), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("hosts") as batch:
        batch.drop_column("machine")
