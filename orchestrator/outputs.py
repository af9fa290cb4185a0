"""Turn the container's events into stored messages.

=================  ==============  ================  ==============================
event              message_type    sender            metadata
=================  ==============  ================  ==============================
assistant          assistant       bot               -
tool_result        tool_result     command_output    envelope + exit_code, tool_use_id, tool
tool_use           assistant       tool_use          tool_use_id, tool, input
thinking           assistant       thinking          -
=================  ==============  ================  ==============================

``tool_use`` and ``thinking`` are stored for the record but never shown to
the model again (see ``orchestrator.messages``).  Message ids are derived
from the run id and the event's position, so storing an event twice (a
retried step) keeps one copy.
"""

from __future__ import annotations

import json
from typing import Any

from agent_runner.protocol import AssistantEvent, Event, ThinkingEvent, ToolResultEvent, ToolUseEvent
from pydantic import BaseModel

from .envelopes import InvalidMessageMetadata, build_structured_envelope
from .messages import (
    SENDER_BOT,
    SENDER_COMMAND_OUTPUT,
    SENDER_HOST,
    SENDER_THINKING,
    SENDER_TOOL_USE,
    MessageType,
)


class OutputMessage(BaseModel):
    id: str
    sender: str
    sender_name: str
    content: str
    message_type: MessageType
    metadata: dict[str, Any] | None = None


def event_to_message(event: Event, *, run_id: str, index: int, assistant_name: str) -> OutputMessage | None:
    mid = f"{run_id}-{index:04d}"
    if isinstance(event, AssistantEvent):
        if not event.text.strip():
            return None
        return OutputMessage(
            id=mid, sender=SENDER_BOT, sender_name=assistant_name, content=event.text,
            message_type="assistant",
        )
    if isinstance(event, ToolResultEvent):
        return OutputMessage(
            id=mid, sender=SENDER_COMMAND_OUTPUT, sender_name=event.name, content=event.output,
            message_type="tool_result", metadata=_tool_result_metadata(event),
        )
    if isinstance(event, ToolUseEvent):
        shown = event.input.get("command") if event.name == "bash" else None
        text = f"{event.name}: {shown}" if isinstance(shown, str) else f"{event.name} {json.dumps(event.input)}"
        return OutputMessage(
            id=mid, sender=SENDER_TOOL_USE, sender_name=event.name, content=text,
            message_type="assistant",
            metadata={"tool_use_id": event.id, "tool": event.name, "input": event.input},
        )
    if isinstance(event, ThinkingEvent):
        return OutputMessage(
            id=mid, sender=SENDER_THINKING, sender_name=assistant_name, content=event.text,
            message_type="assistant",
        )
    return None


def _tool_result_metadata(event: ToolResultEvent) -> dict[str, Any]:
    """The runner's envelope (CODE_EDIT, TODO, TOOL_CALL) with the result's facts as extras.

    The container is not trusted: an envelope that does not validate is
    dropped (the reason kept) rather than failing the run or the store.
    """
    extras = {"exit_code": event.exit_code, "tool_use_id": event.tool_use_id, "tool": event.name}
    env = event.envelope
    if not env:
        return extras
    try:
        return build_structured_envelope(
            env.get("message_type"), env.get("payload", {}), extras=extras, version=env.get("version", 1)
        )
    except InvalidMessageMetadata as exc:
        return {**extras, "invalid_envelope": str(exc)}


def host_message(*, run_id: str, text: str) -> OutputMessage:
    """An operational notice for people; never sent to the model."""
    return OutputMessage(
        id=f"{run_id}-host", sender=SENDER_HOST, sender_name="host", content=text, message_type="host"
    )
