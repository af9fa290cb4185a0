"""The ``edit_message`` tool: change the words of one of the agent's own earlier messages in
this chat ("working on it" into the result), on every channel that shows it.

The runner refuses what it can see is wrong (no words, too long, a place that is not a
count); the host finds the message (its own, in this group, not superseded: ``nth_last``
counts back from its latest), edits it keeping the old words, updates it in place on the
channels, and says in the chat when it cannot.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from ..protocol import EditEvent
from ..providers.base import ToolSpec
from .base import ToolContext, ToolOutcome, failed, int_arg, str_arg

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


def edit_message(args: Mapping[str, Any], ctx: ToolContext) -> ToolOutcome:
    text = str_arg(args, "text", NAME)
    if isinstance(text, ToolOutcome):
        return text
    assert text is not None  # required above
    if len(text) > MAX_CHARS:
        return failed(NAME, f"text is {len(text)} characters; the limit is {MAX_CHARS}")
    back = int_arg(args, "nth_last", NAME, 1)
    if isinstance(back, ToolOutcome):
        return back
    if back > MAX_BACK:
        return failed(NAME, f"'nth_last' is at most {MAX_BACK}")
    if ctx.emit is None:
        return failed(NAME, "no chat to edit in outside a run")
    ctx.emit(EditEvent(text=text, nth_last=back))
    return ToolOutcome("Asked the host to edit your message; it says in the chat if it cannot.", 0)
