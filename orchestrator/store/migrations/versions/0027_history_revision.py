"""A chat's history revision (issue 37): ``groups.history_rev``, moved by the database itself.

A worker keeps the history it read for a group's last run and reads only what
was stored since for the next (``orchestrator/run/history_cache.py``).  That is
right only while no row it kept has changed, so every change to a stored
message's view (its words, metadata, type, sender, an edit or supersede mark)
and every deleted message moves its group's ``history_rev``: triggers, so that
no writer (an edit, a regenerate, an import, a retention prune, a future one)
can forget to.  A new row does not move it (it has a higher seq: the keeper
reads it), nor does recording a message's trace (``traceparent``).

SQLite drops a table's triggers with the table: a later migration that
rebuilds ``messages`` (Alembic's batch mode) must create them again
(``tests/host/test_history_cache.py`` checks they fire at the head).

Revision ID: 0027
Revises: 0026
Create Date: 2026-11-28
"""

import sqlalchemy as sa
from alembic import op

revision = "0027"
down_revision = "0026"
branch_labels = None
depends_on = None

# The columns a stored message's view is made of (orchestrator/store/message_log.py's
# _STORED_FIELDS, "metadata" being the JSON column): an UPDATE of any moves the revision.
_VIEW = (
    *("id", "chat_jid", "sender", "sender_name", "content", "timestamp", "is_from_me", "message_type", "metadata"),
    *("superseded_at", "edited_at"),
)
_VIEW_COLUMNS = ", ".join(_VIEW)


def _row(alias: str) -> str:
    """The view's columns of ``OLD`` or ``NEW`` as one row (PostgreSQL's ``json`` has no
    equality: compared as its text)."""
    return "(" + ", ".join(f'{alias}."{c}"' + ("::text" if c == "metadata" else "") for c in _VIEW) + ")"


_SQLITE = [
    f"""CREATE TRIGGER messages_history_changed AFTER UPDATE OF {_VIEW_COLUMNS} ON messages
    BEGIN UPDATE groups SET history_rev = history_rev + 1 WHERE chat_jid IN (OLD.chat_jid, NEW.chat_jid); END""",
    """CREATE TRIGGER messages_history_deleted AFTER DELETE ON messages
    BEGIN UPDATE groups SET history_rev = history_rev + 1 WHERE chat_jid = OLD.chat_jid; END""",
]

_POSTGRESQL = [
    # The columns are compared in the function, not named in the trigger (``UPDATE OF``):
    # PostgreSQL refuses to change the type or collation of a column a trigger names.
    f"""CREATE FUNCTION messages_history_changed() RETURNS trigger LANGUAGE plpgsql AS $$
    BEGIN
        IF {_row("OLD")} IS DISTINCT FROM {_row("NEW")} THEN
            UPDATE groups SET history_rev = history_rev + 1 WHERE chat_jid IN (OLD.chat_jid, NEW.chat_jid);
        END IF;
        RETURN NULL;
    END $$""",
    """CREATE TRIGGER messages_history_changed AFTER UPDATE ON messages
    FOR EACH ROW EXECUTE FUNCTION messages_history_changed()""",
    # A retention prune deletes thousands of rows at once: one UPDATE per group, not per row.
    """CREATE FUNCTION messages_history_deleted() RETURNS trigger LANGUAGE plpgsql AS $$
    BEGIN
        UPDATE groups SET history_rev = history_rev + 1 WHERE chat_jid IN (SELECT DISTINCT chat_jid FROM gone);
        RETURN NULL;
    END $$""",
    """CREATE TRIGGER messages_history_deleted AFTER DELETE ON messages
    REFERENCING OLD TABLE AS gone FOR EACH STATEMENT EXECUTE FUNCTION messages_history_deleted()""",
]


def upgrade() -> None:
    with op.batch_alter_table("groups") as batch:
        batch.add_column(sa.Column("history_rev", sa.Integer(), nullable=False, server_default="0"))
    for statement in _SQLITE if op.get_bind().dialect.name == "sqlite" else _POSTGRESQL:
        op.execute(statement)


def downgrade() -> None:
    sqlite = op.get_bind().dialect.name == "sqlite"
    for name in ("messages_history_changed", "messages_history_deleted"):
        op.execute(f"DROP TRIGGER IF EXISTS {name}" + ("" if sqlite else " ON messages"))
        if not sqlite:
            op.execute(f"DROP FUNCTION IF EXISTS {name}()")
    with op.batch_alter_table("groups") as batch:
        batch.drop_column("history_rev")
