"""At most one main group, held by the database (issue 29, security review).

The main group's agent may post into every registered chat
(``store/groups.py`` ``send_refusal``).  ``add_group`` refused a second one, but
only by reading first, and ``import`` took ``is_main`` from the export file, so
an imported export could make a second main group.  This partial unique index
on ``groups (is_main) WHERE is_main`` lets the database refuse any second main
group, whoever writes it (PostgreSQL and SQLite both have partial indexes).

A database that already has more than one main group keeps the oldest one
(earliest ``created_at``, then the smallest ``chat_jid``) and the others become
ordinary groups: their agents keep their own chat and workspace but may post
nowhere else.  The migration logs a warning naming each group it demoted.
Downgrading drops the index and promotes nobody.

Revision ID: 0017
Revises: 0016
Create Date: 2026-11-27
"""

import logging

import sqlalchemy as sa
from alembic import op

revision = "0017"
down_revision = "0016"
branch_labels = None
depends_on = None

log = logging.getLogger("orchestrator.store.migrations")

_MAIN = "is_main"
_groups = sa.table(
    "groups",
    sa.column("chat_jid", sa.Text()),
    sa.column("is_main", sa.Boolean()),
    sa.column("created_at", sa.DateTime()),
)


def upgrade() -> None:
    conn = op.get_bind()
    mains = (
        conn.execute(
            sa.select(_groups.c.chat_jid).where(_groups.c.is_main).order_by(_groups.c.created_at, _groups.c.chat_jid)
        )
        .scalars()
        .all()
    )
    if len(mains) > 1:
        kept, demoted = mains[0], list(mains[1:])
        conn.execute(sa.update(_groups).where(_groups.c.chat_jid.in_(demoted)).values(is_main=False))
        log.warning(
            "more than one main group: kept the oldest, %r; made ordinary groups of %s",
            kept,
            ", ".join(repr(j) for j in demoted),
        )
    op.create_index(
        "uq_groups_one_main",
        "groups",
        ["is_main"],
        unique=True,
        postgresql_where=sa.text(_MAIN),
        sqlite_where=sa.text(_MAIN),
    )


def downgrade() -> None:
    op.drop_index("uq_groups_one_main", table_name="groups")
