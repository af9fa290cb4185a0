"""Questions the agent asks its group (issue 33): ``questions``, ``groups.open_question``
and ``groups.approvers``.

* ``questions``: one row per ``ask_user`` call: the run and tool call that asked, the
  stored message that shows it, its options, how the answer goes back (the call's result, the next message, or, for a
  question the host asks about the sandbox's network, the group's allowlist) and what it is about, its state (open, answered, expired), when it
  expires, and the answer (the options chosen, free text, who gave it, through what).
* ``groups.open_question``: the group's open question, if any (at most one): ingest reads it
  with the group's other columns, so a reply naming an option is seen without another query.
* ``groups.approvers``: a JSON list of the identities that may answer (NULL: anyone in the chat).

Revision ID: 0023
Revises: 0022
Create Date: 2026-11-28
"""

import sqlalchemy as sa
from alembic import op

revision = "0023"
down_revision = "0022"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "questions",
        sa.Column("id", sa.String(16), primary_key=True),
        sa.Column("chat_jid", sa.Text(), nullable=False),
        sa.Column("run_id", sa.String(36), nullable=False),
        sa.Column("tool_use_id", sa.Text(), nullable=False),
        sa.Column("message_seq", sa.Integer(), nullable=True),
        sa.Column("reply_to_seq", sa.Integer(), nullable=True),
        sa.Column("question", sa.Text(), nullable=False),
        sa.Column("options", sa.JSON(), nullable=False),
        sa.Column("multiple", sa.Boolean(), nullable=False),
        sa.Column("allow_other", sa.Boolean(), nullable=False),
        sa.Column("answer_as", sa.String(16), nullable=False),
        sa.Column("subject", sa.JSON(), nullable=True),
        sa.Column("state", sa.String(16), nullable=False),
        sa.Column("asked_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("expires_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("closed_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("answer", sa.JSON(), nullable=True),
        sa.Column("answered_by", sa.Text(), nullable=True),
        sa.Column("answered_by_name", sa.Text(), nullable=True),
        sa.Column("answered_via", sa.String(32), nullable=True),
        sa.Column("answer_seq", sa.Integer(), nullable=True),
        sa.Column("closed_why", sa.Text(), nullable=True),
    )
    op.create_index("idx_questions_chat", "questions", ["chat_jid", "asked_at"])
    op.create_index("idx_questions_due", "questions", ["state", "expires_at"])
    with op.batch_alter_table("groups") as batch:
        batch.add_column(sa.Column("open_question", sa.String(16), nullable=True))
        batch.add_column(sa.Column("approvers", sa.JSON(), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("groups") as batch:
        batch.drop_column("approvers")
        batch.drop_column("open_question")
    op.drop_index("idx_questions_due", table_name="questions")
    op.drop_index("idx_questions_chat", table_name="questions")
    op.drop_table("questions")
