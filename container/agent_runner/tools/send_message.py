"""The ``send_message`` tool: post into a chat while the run is still working.

The runner only refuses what it already knows is not allowed (a chat that is
neither this run's own nor one of ``ContainerInput.send_targets``); the host
decides for real when the event arrives, because nothing the container says
is trusted.
"""

from __future__ import annotations

from typing import Annotated

from msgspec import Meta

from ..protocol import SendMessageEvent
from ..providers.base import ToolSpec
from .base import NonBlank, ToolArgs, ToolContext, ToolOutcome, failed

NAME = "send_message"
MAX_CHARS = 20_000

SPEC = ToolSpec(
    name=NAME,
    description=(
        "Send a message to the chat right away, before your final answer (for progress "
        "updates on long tasks). Without chat_jid it goes to this chat; the main group may "
        "name another registered chat."
    ),
    input_schema={
        "type": "object",
        "properties": {
            "text": {"type": "string", "description": "The message."},
            "chat_jid": {"type": "string", "description": "Target chat (default: this chat)."},
        },
        "required": ["text"],
    },
)


class SendMessageArgs(ToolArgs):
    text: Annotated[NonBlank, Meta(max_length=MAX_CHARS)]
    chat_jid: NonBlank | None = None


def send_message(args: SendMessageArgs, ctx: ToolContext) -> ToolOutcome:
    text, target = args.text, args.chat_jid or ctx.chat_jid
    if target != ctx.chat_jid and target not in ctx.send_targets:
        return failed(NAME, f"this group may not post to {target!r}; only to its own chat {ctx.chat_jid!r}")
    if ctx.emit is None:
        return failed(NAME, "no chat to post to outside a run")
    ctx.emit(SendMessageEvent(chat_jid=target, text=text))
    return ToolOutcome(f"Message sent to {target}.", 0)
