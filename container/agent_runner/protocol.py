"""The host <-> container protocol: the one contract both sides share.

The host writes one :class:`ContainerInput` JSON document on the container's
stdin and closes it.  The container writes one :data:`Event` JSON object per
line on stdout (logs go to stderr).  A line that does not parse as an event is
reported by the host and skipped, never fatal.

This module is imported by the host (``orchestrator``) and by the runner in
the image, so it depends on msgspec alone.  msgspec, not pydantic: every cold
run starts a fresh interpreter in a fresh container, and importing pydantic
and building these models cost about 230 ms of that start (msgspec: ~15 ms;
docs/performance.md).  Structs validate when decoded (:func:`decode_input`,
:func:`parse_event`), not when constructed in code.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal, TypeVar, Union

import msgspec
from msgspec import Meta, field

PROTOCOL_VERSION = 1

# Raised by the decoders below on malformed JSON or a document that does not
# fit the model (msgspec.ValidationError is a DecodeError).
ProtocolError = msgspec.DecodeError

_S = TypeVar("_S", bound="_Model")


class _Model(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    # Unknown fields are a protocol error, not something to silently drop.

    @classmethod
    def from_dict(cls: type[_S], data: dict[str, Any]) -> _S:
        """Validate plain data (nested dicts and lists) into this model; raises :data:`ProtocolError`."""
        return msgspec.convert(data, cls)

    def to_json(self) -> bytes:
        return _ENCODER.encode(self)

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = msgspec.to_builtins(self)
        return out

    def replace(self: _S, **changes: Any) -> _S:
        return msgspec.structs.replace(self, **changes)


_ENCODER = msgspec.json.Encoder()


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
    max_tokens: Annotated[int, Meta(ge=1)] = 1024
    base_url: str | None = None
    socket_path: str | None = None


class Limits(_Model):
    max_turns: Annotated[int, Meta(ge=1)] = 8
    bash_timeout_s: Annotated[float, Meta(gt=0)] = 60.0
    output_cap_bytes: Annotated[int, Meta(ge=256)] = 16_000


class ContainerInput(_Model, kw_only=True):
    protocol_version: int = PROTOCOL_VERSION
    run_id: str
    chat_jid: str
    group_folder: str
    assistant_name: str
    messages: list[SdkMessage]
    system_notices: list[str] = field(default_factory=list)
    # Other chats this run's send_message may post to (the host decides and
    # checks again; this only lets the tool refuse early and say why).
    send_targets: list[str] = field(default_factory=list)
    session_id: str | None = None
    model: ModelSettings = field(default_factory=ModelSettings)
    limits: Limits = field(default_factory=Limits)


_INPUT_DECODER = msgspec.json.Decoder(ContainerInput)


def decode_input(raw: str | bytes) -> ContainerInput:
    """Validate one ContainerInput document; raises :data:`ProtocolError`."""
    return _INPUT_DECODER.decode(raw)


# ---------------------------------------------------------------------------
# Output events (one JSON object per stdout line)
# ---------------------------------------------------------------------------


class Usage(_Model):
    input_tokens: int = 0
    output_tokens: int = 0


class _Event(_Model, tag_field="type"):
    # Each event's JSON carries its kind in "type" (the struct's tag).

    @property
    def type(self) -> str:
        return str(self.__struct_config__.tag)


class AssistantEvent(_Event, tag="assistant"):
    """Text the model says to the chat."""

    text: str


class ThinkingEvent(_Event, tag="thinking"):
    text: str


class ToolUseEvent(_Event, tag="tool_use"):
    id: str
    name: str
    input: dict[str, Any]


class ToolResultEvent(_Event, tag="tool_result"):
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


class SendMessageEvent(_Event, tag="send_message"):
    """The agent posts ``text`` into ``chat_jid`` during the run (its own chat,
    or, for the main group, any registered chat).  The host authorizes it."""

    chat_jid: str
    text: str


class ResultEvent(_Event, tag="result"):
    """Always the last event of a successful run."""

    usage: Usage = field(default_factory=Usage)
    session_id: str | None = None
    stop_reason: str | None = None
    num_turns: int = 0


class ErrorEvent(_Event, tag="error"):
    """The run failed inside the container; ``retryable`` marks transient causes."""

    message: str
    retryable: bool = False


Event = Union[AssistantEvent, ThinkingEvent, ToolUseEvent, ToolResultEvent, SendMessageEvent, ResultEvent, ErrorEvent]
_EVENT_DECODER = msgspec.json.Decoder(Event)


def parse_event(line: str | bytes) -> Event:
    """Parse one stdout line; raises :data:`ProtocolError` on garbage."""
    return _EVENT_DECODER.decode(line)


def dump_event(event: Event) -> str:
    """Serialize one event as a single line (no trailing newline)."""
    return _ENCODER.encode(event).decode()
