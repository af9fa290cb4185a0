"""A Chat Completions request from our blocks (ours mirror Anthropic's):

* the system prompt -> the first message, ``role: "system"``;
* assistant text -> ``content``; assistant tool calls -> ``tool_calls`` with
  the input as a JSON string; thinking is not sent back (Chat Completions
  has no field for it);
* tool results -> one ``role: "tool"`` message each, with ``tool_call_id``,
  right after the assistant turn that called them (the API requires that);
  other user text follows as a ``user`` message, with its images as
  ``image_url`` parts (data URLs) when it has any;
* our tools -> function tools, their input schema as the ``parameters``.

A result answering a call whose arguments were not a JSON object is sent back
prefixed with a note saying so (``openai_tool_calls.py``).
"""

from __future__ import annotations

import json
from typing import Literal, NotRequired, TypedDict, Union

from ..protocol import JsonObject
from .base import ImageBlock, ProviderMessage, ToolResultBlock, ToolSpec, ToolUseBlock, render_tool_result
from .openai_tool_calls import INVALID_ARGUMENTS_NOTE, raw_arguments

# The Chat Completions JSON as this provider writes it.


class SystemWire(TypedDict):
    role: Literal["system"]
    content: str


class TextPartWire(TypedDict):
    type: Literal["text"]
    text: str


class ImageUrlWire(TypedDict):
    url: str  # a data: URL (the image inline, base64)


class ImagePartWire(TypedDict):
    type: Literal["image_url"]
    image_url: ImageUrlWire


class UserWire(TypedDict):
    role: Literal["user"]
    # Plain text, or parts when the turn carries images (the vision form of the API).
    content: str | list[TextPartWire | ImagePartWire]


class FunctionCallWire(TypedDict):
    name: str
    arguments: str  # the call's input as a JSON string


class ToolCallWire(TypedDict):
    id: str
    type: Literal["function"]
    function: FunctionCallWire


class AssistantWire(TypedDict):
    role: Literal["assistant"]
    content: str | None
    tool_calls: NotRequired[list[ToolCallWire]]


class ToolWire(TypedDict):
    role: Literal["tool"]
    tool_call_id: str
    content: str


WireMessage = Union[SystemWire, UserWire, AssistantWire, ToolWire]


class FunctionWire(TypedDict):
    name: str
    description: str
    parameters: JsonObject  # the tool's JSON Schema


class FunctionToolWire(TypedDict):
    type: Literal["function"]
    function: FunctionWire


class StreamOptions(TypedDict):
    include_usage: bool


class ChatRequest(TypedDict):
    model: str
    messages: list[WireMessage]
    max_tokens: int
    stream: bool
    stream_options: StreamOptions  # the usage in a last chunk (servers that do not know it ignore it)
    tools: NotRequired[list[FunctionToolWire]]  # only when there are tools


def _tool_message(block: ToolResultBlock, invalid: dict[str, str]) -> ToolWire:
    text = render_tool_result(block)
    if block.is_error and block.exit_code is None:
        text = f"[error]\n{text}"
    if block.tool_use_id in invalid:
        text = INVALID_ARGUMENTS_NOTE.format(raw=invalid[block.tool_use_id]) + "\n" + text
    return {"role": "tool", "tool_call_id": block.tool_use_id, "content": text}


def _assistant_message(message: ProviderMessage) -> AssistantWire | None:
    text = message.text()
    calls = [b for b in message.content if isinstance(b, ToolUseBlock)]
    if not calls and not text:
        return None  # e.g. a turn with thinking only: nothing this API can take back
    wire: AssistantWire = {"role": "assistant", "content": text or None}
    if calls:
        wire["tool_calls"] = [
            {
                "id": c.id,
                "type": "function",
                "function": {"name": c.name, "arguments": json.dumps(c.input, ensure_ascii=False)},
            }
            for c in calls
        ]
    return wire


def messages_to_wire(system: str, messages: list[ProviderMessage]) -> list[WireMessage]:
    """The ``messages`` array of a request (see the module docstring)."""
    invalid = {
        b.id: raw
        for m in messages
        for b in m.content
        if isinstance(b, ToolUseBlock) and (raw := raw_arguments(b)) is not None
    }
    wire: list[WireMessage] = [{"role": "system", "content": system}] if system else []
    for message in messages:
        if message.role == "assistant":
            turn = _assistant_message(message)
            if turn is not None:
                wire.append(turn)
            continue
        # Tool results first: they must directly follow the calls they answer.
        wire.extend(_tool_message(b, invalid) for b in message.content if isinstance(b, ToolResultBlock))
        text = message.text()
        images = [b for b in message.content if isinstance(b, ImageBlock)]
        if images:
            parts: list[TextPartWire | ImagePartWire] = [{"type": "text", "text": text}] if text else []
            parts.extend(
                {"type": "image_url", "image_url": {"url": f"data:{b.media_type};base64,{b.data}"}} for b in images
            )
            wire.append({"role": "user", "content": parts})
        elif text:
            wire.append({"role": "user", "content": text})
    return wire


def tools_to_wire(tools: list[ToolSpec]) -> list[FunctionToolWire]:
    return [
        {
            "type": "function",
            "function": {"name": t.name, "description": t.description, "parameters": t.input_schema},
        }
        for t in tools
    ]
