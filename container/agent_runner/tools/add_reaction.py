"""The ``add_reaction`` tool: put an emoji on a person's message of this chat (a 👀 for "on
it", a ✅ for "done"), on every channel that shows it.

The emoji must be one of the table every channel can be asked for
(``protocol.REACTIONS``, shown in docs/messages.md): one outside it is refused here, with
the table, and one Telegram cannot show is said in the result (it shows elsewhere).  The
host finds the message (a person's, in this group, not superseded: ``nth_last`` counts
back from the latest), keeps the reaction once, reacts on the channels, and says in the
chat when it cannot.
"""

from __future__ import annotations

from typing import Annotated

from msgspec import Meta

from ..protocol import REACTIONS, ReactEvent, reaction_of
from ..providers.base import ToolSpec
from .base import Count, NonBlank, ToolArgs, ToolContext, ToolOutcome, failed

NAME = "add_reaction"
MAX_BACK = 50
TABLE = " ".join(r.emoji for r in REACTIONS)

SPEC = ToolSpec(
    name=NAME,
    description=(
        "React to a person's message in this chat with one emoji, shown on every channel "
        "(for example 👀 when you start on a request, ✅ when it is done). By default the "
        f"latest message from a person; nth_last 2 is the one before it. One of: {TABLE}"
    ),
    input_schema={
        "type": "object",
        "properties": {
            "emoji": {"type": "string", "description": "One emoji of the list above."},
            "nth_last": {
                "type": "integer",
                "minimum": 1,
                "maximum": MAX_BACK,
                "description": "Which message from a person, counting back from the latest (1, the default).",
            },
        },
        "required": ["emoji"],
    },
)


class AddReactionArgs(ToolArgs):
    emoji: Annotated[NonBlank, Meta(max_length=32)]
    nth_last: Annotated[Count, Meta(le=MAX_BACK)] = 1


def add_reaction(args: AddReactionArgs, ctx: ToolContext) -> ToolOutcome:
    reaction = reaction_of(args.emoji)
    if reaction is None:
        return failed(NAME, f"{args.emoji!r} is not one of the reactions every channel takes: {TABLE}")
    if ctx.emit is None:
        return failed(NAME, "no chat to react in outside a run")
    ctx.emit(ReactEvent(emoji=reaction.emoji, nth_last=args.nth_last))
    said = f"Asked the host to react with {reaction.emoji}; it says in the chat if it cannot."
    if reaction.telegram is None:
        said += " Telegram cannot show this emoji (its bots have a fixed set), so it shows on the other channels only."
    return ToolOutcome(said, 0)
