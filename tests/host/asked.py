"""A question the agent asked, stored as the pipeline stores one (``run/chat_outputs.py``):
its row, the group's open question, and the assistant's message with its APPROVAL envelope,
queued for the group's channels.  For the channels' tests, which draw and answer it."""

from __future__ import annotations

from datetime import UTC, datetime

from agent_runner.protocol import QuestionEvent
from orchestrator.model.messages import NewMessage
from orchestrator.run.questions import approval_envelope, new_question, question_text
from orchestrator.store.db import Database
from orchestrator.store.deliveries import record_deliveries
from orchestrator.store.message_log import insert_message, now_iso
from orchestrator.store.questions import Question, insert_question, set_message_seq


def stored_question(
    db: Database, chat_jid: str, question: str, options: list[str], *, multiple: bool = False, allow_other: bool = False
) -> tuple[Question, int]:
    """The question (open) and the seq of the message that shows it."""
    event = QuestionEvent(
        tool_use_id="call_1", question=question, options=options, multiple=multiple, allow_other=allow_other
    )
    asked = new_question(
        chat_jid=chat_jid,
        run_id="run-asking",
        reply_to_seq=0,
        event=event,
        answer_as="tool_result",
        asked_at=datetime.now(UTC),
        ttl_s=3600,
    )
    with db.transaction() as conn:
        insert_question(conn, asked)
        msg, _ = insert_message(
            conn,
            db,
            NewMessage(
                id=f"{asked.id}-asked",
                chat_jid=chat_jid,
                sender="bot",
                sender_name="Robo",
                content=question_text(question, options, multiple=multiple, allow_other=allow_other),
                timestamp=now_iso(),
                is_from_me=True,
                message_type="assistant",
                metadata=approval_envelope(asked),
            ),
        )
        set_message_seq(conn, asked.id, msg.seq)
        record_deliveries(conn, msg)
    return asked, msg.seq
