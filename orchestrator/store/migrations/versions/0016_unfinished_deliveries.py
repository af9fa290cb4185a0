"""An index of the unfinished deliveries of each (chat, channel) line.

A delivery is claimable only when no earlier row of its line is ``pending`` or
``sending`` (``store/deliveries.py`` ``claimable``).  With ``idx_deliveries_line``
alone, that test read every earlier row of the line, sent ones included, so each
claim cost time in proportion to the line's history: in the 30-minute PostgreSQL
soak the deliverer fell from ~4 sends/s to 1.1/s as the table grew to ~10,000 rows
(docs/performance.md, "Soak").  This partial index holds the unfinished rows alone,
so the test is one probe whatever the history.  PostgreSQL and SQLite both have
partial indexes.

Revision ID: 0016
Revises: 0015
Create Date: 2026-11-27
"""

import sqlalchemy as sa
from alembic import op

revision = "0016"
down_revision = "0015"
branch_labels = None
depends_on = None

_UNFINISHED = "state IN ('pending', 'sending')"


def upgrade() -> None:
    op.create_index(
        "idx_deliveries_unfinished",
        "deliveries",
        ["chat_jid", "channel", "message_seq"],
        postgresql_where=sa.text(_UNFINISHED),
        sqlite_where=sa.text(_UNFINISHED),
    )


def downgrade() -> None:
    op.drop_index("idx_deliveries_unfinished", table_name="deliveries")
