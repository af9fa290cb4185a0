"""The provider interface: what the agent loop needs from any model.

The internal message format mirrors Anthropic's content blocks (text,
thinking, tool_use, tool_result) because that is the richest format we
speak; other providers translate to and from it.  Plain frozen dataclasses
keep the loop independent of any SDK's types.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Literal, Protocol

from ..protocol import JsonObject


@dataclass(frozen=True)
class TextBlock:
    text: str
    type: Literal["text"] = "text"


@dataclass(frozen=True)
class ThinkingBlock:
    thinking: str
    # Anthropic requires the signature when a thinking block is sent back.
    signature: str | None = None
    # Anthropic's redacted_thinking: encrypted, no text, sent back as it came.
    redacted_data: str | None = None
    type: Literal["thinking"] = "thinking"


@dataclass(frozen=True)
class ToolUseBlock:
    id: str
    name: str
    input: JsonObject  # what the model sent: each tool checks its own keys
    type: Literal["tool_use"] = "tool_use"


@dataclass(frozen=True)
class ToolResultBlock:
    tool_use_id: str
    content: str
    is_error: bool = False
    # Kept apart from ``content`` so each provider decides how to show it.
    exit_code: int | None = None
    type: Literal["tool_result"] = "tool_result"


@dataclass(frozen=True)
class ImageBlock:
    """An image a person sent, scaled and encoded for the model (``agent_runner/images.py``)."""

    media_type: str  # image/png or image/jpeg
    data: str  # base64
    width: int
    height: int
    type: Literal["image"] = "image"


ContentBlock = TextBlock | ThinkingBlock | ToolUseBlock | ToolResultBlock | ImageBlock
Role = Literal["user", "assistant"]


@dataclass
class ProviderMessage:
    role: Role
    content: list[ContentBlock]

    def text(self) -> str:
        """The message's text blocks joined (tool blocks are left out)."""
        return "\n\n".join(b.text for b in self.content if isinstance(b, TextBlock))


@dataclass(frozen=True)
class ToolSpec:
    """A tool as the model sees it: name, description, JSON schema of its input."""

    name: str
    description: str
    input_schema: JsonObject  # a JSON Schema, handed to the model as written


@dataclass(frozen=True)
class TokenUsage:
    input_tokens: int = 0  # cache reads and writes included
    output_tokens: int = 0
    cache_read_input_tokens: int = 0
    cache_creation_input_tokens: int = 0


@dataclass(frozen=True)
class ProviderResponse:
    content: list[ContentBlock]
    stop_reason: str | None
    usage: TokenUsage = field(default_factory=TokenUsage)

    def tool_uses(self) -> list[ToolUseBlock]:
        return [b for b in self.content if isinstance(b, ToolUseBlock)]


# Called with (index of the text block in the turn, text) as a streamed answer's
# text arrives, so the chat can show it before the turn is done.
TextSink = Callable[[int, str], None]


class Provider(Protocol):
    """One model call: the whole conversation in, one assistant turn out.

    A streaming provider also hands each piece of text to ``on_text`` as it
    arrives; the complete turn it returns is still what counts (the loop
    stores that).  Implementations raise
    :class:`agent_runner.errors.ProviderError` on failure.
    """

    def complete(
        self, system: str, messages: list[ProviderMessage], tools: list[ToolSpec], on_text: TextSink | None = None
    ) -> ProviderResponse: ...


def render_tool_result(block: ToolResultBlock) -> str:
    """Tool result text for a text-only wire format: exit code first, then output.

    Same header as history tool_result messages (see ``conversation``), so
    the model sees one format for current and past tool results.
    """
    if block.exit_code is None:
        return block.content
    return f"[exit_code={block.exit_code}]\n{block.content}"
