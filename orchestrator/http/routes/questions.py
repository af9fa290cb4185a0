"""The agent's questions: list a chat's, and answer one (``orchestrator answer``).

What a question is and what an answer does is ``orchestrator/run/questions.py``'s: the
API answers as the operator (it holds the token), so a group's approvers do not limit it.
An answer names options by their text or their number (``option`` for one, ``options``
for several where the question takes several) and, where the question allows it, free
``text``.  No such question in the chat is a 404; an option it does not have, or free text
it does not take, a 400 naming ``option`` or ``text``; a question answered or expired
already a 409, saying by whom or why.
"""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import APIRouter, Request
from pydantic import BaseModel, ConfigDict, Field

from agent_runner.protocol import MAX_OPTIONS
from orchestrator.core.errors import BadInput
from orchestrator.http.state import api_state
from orchestrator.run.questions import Said, announce, answer_question
from orchestrator.store.questions import Question, chat_questions, read_question

router = APIRouter()

_NO_QUESTION: dict[int | str, dict[str, Any]] = {404: {"description": "no such question in the chat"}}
_ANSWER = {
    **_NO_QUESTION,
    409: {"description": "the question was answered or expired already"},
}
_OPTION = Annotated[str, Field(min_length=1, max_length=200, pattern=r"^[^\x00]*$")]


class AnswerBody(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)

    option: _OPTION | None = Field(default=None, description="One option: its text or its number (1 is the first).")
    options: Annotated[list[_OPTION], Field(min_length=1, max_length=MAX_OPTIONS)] | None = Field(
        default=None, description="Several options, for a question that takes several (`multiple`)."
    )
    text: str | None = Field(
        default=None,
        min_length=1,
        max_length=2000,
        pattern=r"^[^\x00]*$",
        description="Free words, for a question that takes them (`allow_other`).",
    )


@router.get("/chats/{chat_jid}/questions", response_model=list[Question])
def questions(request: Request, chat_jid: str, open: bool = False) -> list[Question]:  # the query's name
    """The chat's questions, newest first (``open``: only the one still open, if any)."""
    return chat_questions(api_state(request).db, chat_jid, open_only=open)


@router.post("/chats/{chat_jid}/questions/{question_id}/answer", response_model=Question, responses=_ANSWER)
def answer(request: Request, chat_jid: str, question_id: str, body: AnswerBody) -> Question:
    """Answer the question as the operator: it closes, the answer is stored in the chat for
    the agent (and shown on its channels), and the group wakes."""
    state = api_state(request)
    if body.option is not None and body.options is not None:
        raise BadInput("option", "give option or options, not both")
    said = body.options if body.options is not None else [body.option] if body.option is not None else []
    answered = answer_question(state.db, chat_jid, Said(said, body.text), via="api", question_id=question_id)
    announce(answered, signal=state.signal, signal_delivery=state.signal_delivery)
    closed = read_question(state.db, question_id)
    assert closed is not None
    return closed
