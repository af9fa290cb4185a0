"""``orchestrator answer`` and ``orchestrator questions``: the agent's questions from the
command line, answered as the operator (``orchestrator/run/questions.py``)."""

from __future__ import annotations

from typing import Annotated, Optional

import typer

from orchestrator.cli.support import echo, fail, setup
from orchestrator.core.errors import OrchestratorError
from orchestrator.core.terminal import for_terminal


def answer(
    chat_jid: str,
    option: Annotated[
        Optional[list[str]],
        typer.Argument(help="The option: its text or its number (several for a question that takes several)."),
    ] = None,
    text: Annotated[Optional[str], typer.Option(help="Free words, for a question that takes them.")] = None,
    question: Annotated[
        Optional[str], typer.Option(help="The question's id (default: the chat's open question).")
    ] = None,
) -> None:
    """Answer the agent's question in the chat: the answer goes to the agent and the group wakes."""
    from orchestrator.run.questions import Said, announce, answer_question

    root = setup()
    try:
        answered = answer_question(root.db, chat_jid, Said(option or [], text), via="cli", question_id=question)
    except OrchestratorError as exc:
        raise fail(exc) from exc
    announce(answered, signal=root.signals.group, signal_delivery=root.signals.delivery)
    echo(f"answered {answered.question.id}: {for_terminal(answered.answer)}; the agent will go on", err=True)


def questions(
    chat_jid: str,
    open_only: Annotated[bool, typer.Option("--open", help="Only the open question.")] = False,
) -> None:
    """The chat's questions, newest first: id, state, the question and its options."""
    from orchestrator.store.questions import chat_questions

    root = setup()
    try:
        found = chat_questions(root.db, chat_jid, open_only=open_only)
    except OrchestratorError as exc:
        raise fail(exc) from exc
    for q in found:
        options = " | ".join(f"{i}. {o}" for i, o in enumerate(q.options, 1))
        closed = f" ({q.closed_why})" if q.closed_why else ""
        echo(f"{q.id}  {q.state}{closed}  {for_terminal(q.question)}  [{for_terminal(options)}]")
        if q.answer:
            picked = ", ".join(
                [*(q.answer.get("options") or []), *([q.answer["text"]] if q.answer.get("text") else [])]
            )
            echo(f"    answer: {for_terminal(picked)} by {for_terminal(q.answered_by_name or q.answered_by or '?')}")


def register(app: typer.Typer) -> None:
    app.command()(answer)
    app.command()(questions)
