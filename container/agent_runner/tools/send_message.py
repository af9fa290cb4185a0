"""The ``send_message`` tool: post into a chat while the run is still working.

The runner only refuses what it already knows is not allowed (a chat that is
neither this run's own nor one of ``ContainerInput.send_targets``); the host
decides for real when the event arrives, because nothing the container says
is trusted.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from ..protocol import SendMessageEvent
from ..providers.base import ToolSpec
from .base import ToolContext, ToolOutcome, failed, str_arg

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


def send_message(args: Mapping[str, Any], ctx: ToolContext) -> ToolOutcome:
    text = str_arg(args, "text", NAME)
    if isinstance(text, ToolOutcome):
        return text
    target = str_arg(args, "chat_jid", NAME, required=False)
    if isinstance(target, ToolOutcome):
        return target
    target = target or ctx.chat_jid
    assert text is not None  # required above
    if len(text) > MAX_CHARS:
        return failed(NAME, f"text is {len(text)} characters; the limit is {MAX_CHARS}")
    if target != ctx.chat_jid and target not in ctx.send_targets:
        return failed(NAME, f"this group may not post to {target!r}; only to its own chat {ctx.chat_jid!r}")
    if ctx.emit is None:
        return failed(NAME, "no chat to post to outside a run")
    ctx.emit(SendMessageEvent(chat_jid=target, text=text))
    return ToolOutcome(f"Message sent to {target}.", 0)
