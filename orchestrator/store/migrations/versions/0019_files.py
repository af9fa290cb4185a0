"""Files both ways (issue 31, the store): the ``files`` table.

A row per file a chat stored (a reference), the bytes once per content under
``<data_dir>/files`` by their SHA-256 (orchestrator/store/files.py).  ``owner_jid``
is the chat that stored the content first: its group's file quota counts it.

Revision ID: 0019
Revises: 0018
Create Date: 2026-11-28
"""

import sqlalchemy as sa
from alembic import op

revision = "0019"
down_revision = "0018"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "files",
        sa.Column("id", sa.String(64), primary_key=True),
        sa.Column("chat_jid", sa.Text(), nullable=False),
        sa.Column("sha256", sa.String(64), nullable=False),
        sa.Column("size", sa.BigInteger(), nullable=False),
        sa.Column("mime", sa.Text(), nullable=False),
        sa.Column("name", sa.Text(), nullable=False),
        sa.Column("owner_jid", sa.Text(), nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
    )
    op.create_index("ix_files_sha256", "files", ["sha256"])
    op.create_index("ix_files_owner_jid", "files", ["owner_jid"])
    op.create_index("idx_files_chat_created", "files", ["chat_jid", "created_at"])


def downgrade() -> None:
    op.drop_index("idx_files_chat_created", table_name="files")
    op.drop_index("ix_files_owner_jid", table_name="files")
    op.drop_index("ix_files_sha256", table_name="files")
    op.drop_table("files")
