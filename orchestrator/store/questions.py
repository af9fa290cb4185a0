"""Questions' rows: the ``questions`` table and the group's ``open_question`` mark.

What a question is, who may answer it and what an answer or an expiry stores in the chat
is ``orchestrator/run/questions.py``'s; this module keeps the rows it decides on.  A
question is closed (answered or expired) by a conditional UPDATE on its open state, in
the transaction that stores what closes it, so the first answer counts and every later
one finds it closed, however many channels answer at once.
"""

from __future__ import annotations

from collections.abc import Callable
from datetime import datetime
from typing import Annotated, Literal, get_args

from pydantic import BaseModel, ConfigDict
from sqlalchemy import insert, select, update
from sqlalchemy.orm import Session

from orchestrator.core.jsontypes import JsonObject
from orchestrator.store.db import Connection, Database
from orchestrator.store.stored_literals import column_check
from orchestrator.store.tables import GroupRow, QuestionRow

QuestionState = Literal["open", "answered", "expired"]
QUESTION_STATES: tuple[QuestionState, ...] = get_args(QuestionState)
AnswerAs = Literal["tool_result", "message", "egress"]
ANSWER_AS: tuple[AnswerAs, ...] = get_args(AnswerAs)


class Question(BaseModel):
    """A question the agent asked its group, as stored."""

    model_config = ConfigDict(frozen=True, from_attributes=True)

    id: str
    chat_jid: str
    run_id: str
    tool_use_id: str
    message_seq: int | None
    reply_to_seq: int | None
    question: str
    options: list[str]
    multiple: bool
    allow_other: bool
    answer_as: Annotated[AnswerAs, column_check(ANSWER_AS, "questions.answer_as")]
    # What a question the host asks is about (None: the agent's question).
    subject: JsonObject | None = None
    state: Annotated[QuestionState, column_check(QUESTION_STATES, "questions.state")]
    asked_at: datetime
    expires_at: datetime
    closed_at: datetime | None = None
    answer: JsonObject | None = None
    answered_by: str | None = None
    answered_by_name: str | None = None
    answered_via: str | None = None
    answer_seq: int | None = None
    closed_why: str | None = None


def _conn(session: Session | Connection) -> Connection:
    return session.connection() if isinstance(session, Session) else session


def _one(conn: Connection, stmt: object) -> Question | None:
    row = conn.execute(stmt).mappings().first()  # type: ignore[call-overload]
    return None if row is None else Question.model_validate(dict(row))


def insert_question(session: Session | Connection, question: Question, *, the_groups: bool = True) -> None:
    """Store ``question`` (open), in the caller's transaction; ``the_groups``: as the group's
    open question (the agent's: a reply may answer it, a trigger expires it).  The host's
    questions about the network are not: they are answered by their id (a button, the page,
    ``orchestrator answer --question``)."""
    conn = _conn(session)
    conn.execute(insert(QuestionRow).values(**question.model_dump()))
    if the_groups:
        conn.execute(update(GroupRow).where(GroupRow.chat_jid == question.chat_jid).values(open_question=question.id))


def get_question(session: Session | Connection, question_id: str) -> Question | None:
    return _one(_conn(session), select(QuestionRow.__table__).where(QuestionRow.id == question_id))


def read_question(db: Database, question_id: str) -> Question | None:
    with db.read() as session:
        return get_question(session, question_id)


def open_question_of(session: Session | Connection, chat_jid: str) -> Question | None:
    """The group's open question (None: none), read with its row in the caller's transaction."""
    conn = _conn(session)
    qid = conn.execute(select(GroupRow.open_question).where(GroupRow.chat_jid == chat_jid)).scalar()
    if qid is None:
        return None
    found = get_question(conn, qid)
    return found if found is not None and found.state == "open" else None


def close_question(
    session: Session | Connection,
    question: Question,
    *,
    state: Literal["answered", "expired"],
    closed_at: datetime,
    why: str,
    answer: JsonObject | None = None,
    by: str | None = None,
    by_name: str | None = None,
    via: str | None = None,
) -> bool:
    """Close ``question`` if it is still open (False: it was closed already, by another
    answer or an expiry), and clear its group's open-question mark, in the caller's transaction."""
    conn = _conn(session)
    changed = conn.execute(
        update(QuestionRow)
        .where(QuestionRow.id == question.id, QuestionRow.state == "open")
        .values(
            state=state,
            closed_at=closed_at,
            closed_why=why,
            answer=answer,
            answered_by=by,
            answered_by_name=by_name,
            answered_via=via,
        )
    ).rowcount
    if not changed:
        return False
    conn.execute(
        update(GroupRow)
        .where(GroupRow.chat_jid == question.chat_jid, GroupRow.open_question == question.id)
        .values(open_question=None)
    )
    return True


def set_answer_seq(session: Session | Connection, question_id: str, seq: int) -> None:
    """Name the stored message that closed the question (the answer, or why it expired)."""
    _conn(session).execute(update(QuestionRow).where(QuestionRow.id == question_id).values(answer_seq=seq))


def set_message_seq(session: Session | Connection, question_id: str, seq: int) -> None:
    """Name the stored message that shows the question."""
    _conn(session).execute(update(QuestionRow).where(QuestionRow.id == question_id).values(message_seq=seq))


def chat_questions(db: Database, chat_jid: str, *, open_only: bool = False, limit: int = 50) -> list[Question]:
    """The chat's questions, newest first."""
    stmt = select(QuestionRow.__table__).where(QuestionRow.chat_jid == chat_jid)
    if open_only:
        stmt = stmt.where(QuestionRow.state == "open")
    stmt = stmt.order_by(QuestionRow.asked_at.desc(), QuestionRow.id).limit(limit)
    with db.read() as session:
        rows = session.connection().execute(stmt).mappings().all()
    return [Question.model_validate(dict(r)) for r in rows]


def due_questions(db: Database, now: datetime, limit: int = 100) -> list[Question]:
    """Open questions whose time is up."""
    stmt = (
        select(QuestionRow.__table__)
        .where(QuestionRow.state == "open", QuestionRow.expires_at <= now)
        .order_by(QuestionRow.expires_at)
        .limit(limit)
    )
    with db.read() as session:
        rows = session.connection().execute(stmt).mappings().all()
    return [Question.model_validate(dict(r)) for r in rows]


def run_question(db: Database, run_id: str) -> Question | None:
    """The question the run asked (its last), if it asked one."""
    stmt = (
        select(QuestionRow.__table__)
        .where(QuestionRow.run_id == run_id)
        .order_by(QuestionRow.asked_at.desc(), QuestionRow.id.desc())
        .limit(1)
    )
    with db.read() as session:
        return _one(session.connection(), stmt)


def group_open_question(db: Database, chat_jid: str) -> Question | None:
    """The group's open question (None: none), in a read of its own."""
    with db.read() as session:
        return open_question_of(session, chat_jid)


def open_egress_question(session: Session | Connection, chat_jid: str, host: str, port: int) -> Question | None:
    """The chat's open question about reaching ``host:port``, if one is open already."""
    stmt = select(QuestionRow.__table__).where(
        QuestionRow.chat_jid == chat_jid, QuestionRow.state == "open", QuestionRow.answer_as == "egress"
    )
    for row in _conn(session).execute(stmt).mappings().all():
        question = Question.model_validate(dict(row))
        if (question.subject or {}).get("host") == host and (question.subject or {}).get("port") == port:
            return question
    return None


def add_egress_rule(
    session: Session | Connection, chat_jid: str, rule: str, *, validate: Callable[[JsonObject], object]
) -> bool:
    """Add ``rule`` to the group's egress allowlist (its container_config's), in the caller's
    transaction; False when it was there already.  ``validate`` is given the whole config as
    it would be stored, and raises to refuse it: nothing is stored then (the caller passes the
    container config's own validation, the one ``groups set --network`` passes, so a config
    that does not parse is never stored; this floor cannot import it)."""
    conn = _conn(session)
    config = conn.execute(select(GroupRow.container_config).where(GroupRow.chat_jid == chat_jid)).scalar()
    config = dict(config or {})
    egress = dict(config.get("egress") or {})
    allow = list(egress.get("allow") or [])
    if rule in allow:
        return False
    egress["allow"] = [*allow, rule]
    config["egress"] = egress
    validate(config)
    conn.execute(update(GroupRow).where(GroupRow.chat_jid == chat_jid).values(container_config=config))
    return True
