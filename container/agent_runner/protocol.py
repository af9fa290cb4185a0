"""The host <-> container protocol: the one contract both sides share.

The host writes one :class:`ContainerInput` JSON document on the container's
stdin and closes it.  The container writes one :data:`Event` JSON object per
line on stdout (logs go to stderr).  A line that does not parse as an event is
reported by the host and skipped, never fatal.

This module is imported by the host (``orchestrator``) and by the runner in
the image, so it depends on pydantic alone.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal, Union

from pydantic import BaseModel, ConfigDict, Field, TypeAdapter

PROTOCOL_VERSION = 1


class _Model(BaseModel):
    # Unknown fields are a protocol error, not something to silently drop.
    model_config = ConfigDict(extra="forbid")


# ---------------------------------------------------------------------------
# Input
# ---------------------------------------------------------------------------

SdkRole = Literal["user", "assistant", "system", "tool_result"]


class SdkMessage(_Model):
    """One message of the model's view of the chat (host messages never appear)."""

    role: SdkRole
    content: str
    sender_name: str | None = None
    timestamp: str | None = None
    metadata: dict[str, Any] | None = None


class ModelSettings(_Model):
    """Which model answers and how the container reaches it.

    No secret ever appears here: a real provider is reached through a gateway
    on the host that injects the key (``socket_path``), or through
    ``base_url`` for a keyless local server.
    """

    # "openai": any OpenAI-compatible Chat Completions server (Ollama, vLLM,
    # llama.cpp's server, OpenAI).
    provider: Literal["offline", "anthropic", "openai"] = "offline"
    model: str = "offline"
    max_tokens: int = Field(default=1024, ge=1)
    base_url: str | None = None
    socket_path: str | None = None


class Limits(_Model):
    max_turns: int = Field(default=8, ge=1)
    bash_timeout_s: float = Field(default=60.0, gt=0)
    output_cap_bytes: int = Field(default=16_000, ge=256)


class ContainerInput(_Model):
    protocol_version: int = PROTOCOL_VERSION
    run_id: str
    chat_jid: str
    group_folder: str
    assistant_name: str
    messages: list[SdkMessage]
    system_notices: list[str] = Field(default_factory=list)
    # Other chats this run's send_message may post to (the host decides and
    # checks again; this only lets the tool refuse early and say why).
    send_targets: list[str] = Field(default_factory=list)
    session_id: str | None = None
    model: ModelSettings = Field(default_factory=ModelSettings)
    limits: Limits = Field(default_factory=Limits)


# ---------------------------------------------------------------------------
# Output events (one JSON object per stdout line)
# ---------------------------------------------------------------------------


class Usage(_Model):
    input_tokens: int = 0
    output_tokens: int = 0


class AssistantEvent(_Model):
    """Text the model says to the chat."""

    type: Literal["assistant"] = "assistant"
    text: str


class ThinkingEvent(_Model):
    type: Literal["thinking"] = "thinking"
    text: str


class ToolUseEvent(_Model):
    type: Literal["tool_use"] = "tool_use"
    id: str
    name: str
    input: dict[str, Any]


class ToolResultEvent(_Model):
    type: Literal["tool_result"] = "tool_result"
    tool_use_id: str
    name: str
    output: str
    exit_code: int
    is_error: bool = False
    # A structured view of the call for the host to keep in the stored
    # message's metadata: ``{"message_type": "CODE_EDIT" | "TODO" |
    # "TOOL_CALL", "version": 1, "payload": {...}}`` (built by
    # ``agent_runner.envelopes``, validated by the host).  None from runners
    # that predate envelopes.
    envelope: dict[str, Any] | None = None


class SendMessageEvent(_Model):
    """The agent posts ``text`` into ``chat_jid`` during the run (its own chat,
    or, for the main group, any registered chat).  The host authorizes it."""

    type: Literal["send_message"] = "send_message"
    chat_jid: str
    text: str


class ResultEvent(_Model):
    """Always the last event of a successful run."""

    type: Literal["result"] = "result"
    usage: Usage = Field(default_factory=Usage)
    session_id: str | None = None
    stop_reason: str | None = None
    num_turns: int = 0


class ErrorEvent(_Model):
    """The run failed inside the container; ``retryable`` marks transient causes."""

    type: Literal["error"] = "error"
    message: str
    retryable: bool = False


Event = Annotated[
    Union[AssistantEvent, ThinkingEvent, ToolUseEvent, ToolResultEvent, SendMessageEvent, ResultEvent, ErrorEvent],
    Field(discriminator="type"),
]
EVENT_ADAPTER: TypeAdapter[Event] = TypeAdapter(Event)


def parse_event(line: str | bytes) -> Event:
    """Parse one stdout line; raises ``pydantic.ValidationError`` on garbage."""
    return EVENT_ADAPTER.validate_json(line)


def dump_event(event: Event) -> str:
    """Serialize one event as a single line (no trailing newline)."""
    return event.model_dump_json()
