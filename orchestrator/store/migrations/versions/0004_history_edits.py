"""Messages can be superseded (regenerate, truncate) and edited; runs keep
the exact input they sent to the container.

Revision ID: 0004
Revises: 0003
Create Date: 2026-11-26
"""

import sqlalchemy as sa
from alembic import op

revision = "0004"
down_revision = "0003"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("messages") as batch:
        batch.add_column(sa.Column("superseded_at", sa.DateTime(timezone=True), nullable=True))
        batch.add_column(sa.Column("edited_at", sa.DateTime(timezone=True), nullable=True))
    with op.batch_alter_table("runs") as batch:
        batch.add_column(sa.Column("input_sha256", sa.String(64), nullable=True))
        batch.add_column(sa.Column("input_json", sa.LargeBinary(), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("runs") as batch:
        batch.drop_column("input_json")
        batch.drop_column("input_sha256")
    with op.batch_alter_table("messages") as batch:
        batch.drop_column("edited_at")
        batch.drop_column("superseded_at")
