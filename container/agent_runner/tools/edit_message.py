"""The ``edit_message`` tool: change the words of one of the agent's own earlier messages in
this chat ("working on it" into the result), on every channel that shows it.

The runner refuses what it can see is wrong (no words, too long, a place that is not a
count); the host finds the message (its own, in this group, not superseded: ``nth_last``
counts back from its latest), edits it keeping the old words, updates it in place on the
channels, and says in the chat when it cannot.
"""

from __future__ import annotations

from typing import Annotated

from msgspec import Meta

from ..protocol import EditEvent
from ..providers.base import ToolSpec
from .base import Count, NonBlank, ToolArgs, ToolContext, ToolOutcome, failed

NAME = "edit_message"
MAX_CHARS = 20_000
MAX_BACK = 50

SPEC = ToolSpec(
    name=NAME,
    description=(
        "Change the words of one of your own earlier messages in this chat (for example turn "
        "'working on it' into the result); every channel shows the new words in place. By "
        "default your latest message; nth_last 2 is the one before it."
    ),
    input_schema={
        "type": "object",
        "properties": {
            "text": {"type": "string", "description": "The message's new words, whole."},
            "nth_last": {
                "type": "integer",
                "minimum": 1,
                "maximum": MAX_BACK,
                "description": "Which of your messages, counting back from your latest (1, the default).",
            },
        },
        "required": ["text"],
    },
)


class EditMessageArgs(ToolArgs):
    text: Annotated[NonBlank, Meta(max_length=MAX_CHARS)]
    nth_last: Annotated[Count, Meta(le=MAX_BACK)] = 1


def edit_message(args: EditMessageArgs, ctx: ToolContext) -> ToolOutcome:
    if ctx.emit is None:
        return failed(NAME, "no chat to edit in outside a run")
    ctx.emit(EditEvent(text=args.text, nth_last=args.nth_last))
    return ToolOutcome("Asked the host to edit your message; it says in the chat if it cannot.", 0)
