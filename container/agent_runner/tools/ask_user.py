"""The ``ask_user`` tool: ask the group a question with options, and end the run.

The question goes to the host as a ``question`` event (:class:`~agent_runner.protocol.QuestionEvent`)
instead of the call's result; the host shows it on every channel (buttons where a channel
has them, numbered options elsewhere) and the run ends, holding nothing while nobody
answers.  The answer comes back in a later run: to the built-in loop as this call's
result, to Claude Code as the next message.  A run asks one question; the host checks the
question and its options again (what the sandbox writes is not trusted).
"""

from __future__ import annotations

from typing import Annotated

from msgspec import Meta

from ..protocol import MAX_OPTION_CHARS, MAX_OPTIONS, MAX_QUESTION_CHARS, MIN_OPTIONS, QuestionEvent
from ..providers.base import ToolSpec
from .base import ToolArgs, ToolContext, ToolOutcome, bad_input, failed

NAME = "ask_user"

SPEC = ToolSpec(
    name=NAME,
    description=(
        "Ask the people of this chat a question with options (buttons on the channels that have "
        "them) when you need their decision to go on. Your run ends when you ask: the answer "
        "comes back later (as this call's result, or as the next message). Ask one question at "
        "a time, and only when you cannot reasonably decide yourself."
    ),
    input_schema={
        "type": "object",
        "properties": {
            "question": {"type": "string", "description": "The question, on its own."},
            "options": {
                "type": "array",
                "items": {"type": "string", "maxLength": MAX_OPTION_CHARS},
                "minItems": MIN_OPTIONS,
                "maxItems": MAX_OPTIONS,
                "description": f"{MIN_OPTIONS} to {MAX_OPTIONS} short answers to choose from "
                f"(each at most {MAX_OPTION_CHARS} characters, one line).",
            },
            "multiple": {"type": "boolean", "description": "Several options may be chosen (default: one)."},
            "allow_other": {"type": "boolean", "description": "A free-text answer is welcome too (default: no)."},
        },
        "required": ["question", "options"],
    },
)

POSTED = (
    "Question posted to the chat; the answer will come as the next message. "
    "End your turn now with a short note, without calling another tool."
)


class AskArgs(ToolArgs, forbid_unknown_fields=True):
    question: Annotated[str, Meta(min_length=1, max_length=MAX_QUESTION_CHARS)]
    options: Annotated[
        list[Annotated[str, Meta(min_length=1, max_length=MAX_OPTION_CHARS)]],
        Meta(min_length=MIN_OPTIONS, max_length=MAX_OPTIONS),
    ]
    multiple: bool = False
    allow_other: bool = False


def ask_user(asked: AskArgs, ctx: ToolContext) -> ToolOutcome:
    if ctx.emit is None:
        return failed(NAME, "no chat to ask outside a run")
    if ctx.state.asked:
        return failed(NAME, "one question per run: it was asked already; end your turn and wait for the answer")
    options = [o.strip() for o in asked.options]
    if not asked.question.strip() or not all(options):
        return bad_input(NAME, "the question and every option need words")
    if len({o.casefold() for o in options}) != len(options):
        return bad_input(NAME, "the options must differ from each other")
    if any("\n" in o or "\r" in o for o in options):
        return bad_input(NAME, "an option is one line")
    ctx.state.asked = True
    question = QuestionEvent(
        tool_use_id="",
        question=asked.question.strip(),
        options=options,
        multiple=asked.multiple,
        allow_other=asked.allow_other,
    )
    return ToolOutcome(POSTED, 0, question=question)
