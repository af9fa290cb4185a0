"""The Anthropic Messages API provider, through the official ``anthropic`` SDK.

No secret is ever inside the container.  The API is reached either through
a gateway on the host listening on a unix socket (``socket_path``; the
gateway injects the real key) or through ``base_url`` (a keyless local or
fake server).  The SDK insists on some key, so a placeholder is sent and the
gateway overwrites it.

Every request streams (``"stream": true``): the SDK sends it (its retries
and error mapping for the request itself), and the answer's server-sent
events are read here as they arrive (:class:`MessageStream`), so the text
reaches the chat while the model writes it; the loop still gets the whole
turn.  A server that answers with a whole JSON message instead is read as
one.
"""

from __future__ import annotations

import importlib
import json
import logging
from typing import Any, Literal, NotRequired, TypedDict, Union

import anthropic
import msgspec

from ..errors import InputError, ProviderError
from ..protocol import JsonObject, ModelSettings
from ..sse import SseDecoder, SseError
from .base import (
    ContentBlock,
    ImageBlock,
    ProviderMessage,
    ProviderResponse,
    Role,
    TextBlock,
    TextSink,
    ThinkingBlock,
    TokenUsage,
    ToolResultBlock,
    ToolSpec,
    ToolUseBlock,
    render_tool_result,
)

log = logging.getLogger(__name__)

PLACEHOLDER_API_KEY = "via-gateway"
GATEWAY_BASE_URL = "http://gateway"
MAX_RETRIES = 2
REQUEST_TIMEOUT_S = 600.0


def _sdk_http_module() -> Any:
    """The HTTP library the installed SDK is built on.

    Recent SDKs use ``httpx2`` and reject ``httpx`` objects; older ones use
    ``httpx``.  Using whichever the SDK uses keeps the unix-socket transport
    working across SDK versions.
    """
    for name in ("httpx2", "httpx"):
        try:
            return importlib.import_module(name)
        except ImportError:
            continue
    raise ImportError("neither httpx2 nor httpx is installed")


def _unix_socket_client(socket_path: str) -> Any:
    http = _sdk_http_module()
    transport = http.HTTPTransport(uds=socket_path)
    # DefaultHttpxClient keeps the SDK's own timeouts and connection limits.
    return anthropic.DefaultHttpxClient(transport=transport)


# The Messages API's JSON as this provider writes it: the few shapes it sends,
# written here rather than taken from the SDK's ``*Param`` types, which change
# from one SDK version to the next (the image takes any ``anthropic>=0.40``).


class CacheControl(TypedDict):
    type: Literal["ephemeral"]


class TextWire(TypedDict):
    type: Literal["text"]
    text: str
    cache_control: NotRequired[CacheControl]  # a prompt-cache breakpoint (_mark_cache_prefix)


class ToolUseWire(TypedDict):
    type: Literal["tool_use"]
    id: str
    name: str
    input: JsonObject
    cache_control: NotRequired[CacheControl]


class ToolResultWire(TypedDict):
    type: Literal["tool_result"]
    tool_use_id: str
    content: str
    is_error: bool
    cache_control: NotRequired[CacheControl]


class ThinkingWire(TypedDict):
    type: Literal["thinking"]
    thinking: str
    signature: str


class RedactedThinkingWire(TypedDict):
    type: Literal["redacted_thinking"]
    data: str


class ImageSourceWire(TypedDict):
    type: Literal["base64"]
    media_type: str
    data: str


class ImageWire(TypedDict):
    type: Literal["image"]
    source: ImageSourceWire


WireBlock = Union[TextWire, ToolUseWire, ToolResultWire, ThinkingWire, RedactedThinkingWire, ImageWire]


class WireMessage(TypedDict):
    role: Role
    content: list[WireBlock]


class WireTool(TypedDict):
    name: str
    description: str
    input_schema: JsonObject
    cache_control: NotRequired[CacheControl]


class ThinkingConfig(TypedDict):
    type: Literal["enabled"]
    budget_tokens: int


class _Request(TypedDict):
    model: str
    max_tokens: int
    system: NotRequired[list[TextWire]]  # only when there is a system prompt
    messages: list[WireMessage]
    tools: NotRequired[list[WireTool]]  # only when there are tools
    thinking: NotRequired[ThinkingConfig]  # only when a thinking budget is set


def _block_to_wire(block: ContentBlock) -> WireBlock | None:
    if isinstance(block, TextBlock):
        return {"type": "text", "text": block.text}
    if isinstance(block, ToolUseBlock):
        return {"type": "tool_use", "id": block.id, "name": block.name, "input": block.input}
    if isinstance(block, ImageBlock):
        return {"type": "image", "source": {"type": "base64", "media_type": block.media_type, "data": block.data}}
    if isinstance(block, ToolResultBlock):
        return {
            "type": "tool_result",
            "tool_use_id": block.tool_use_id,
            "content": render_tool_result(block),
            "is_error": block.is_error,
        }
    if isinstance(block, ThinkingBlock) and block.redacted_data:
        return {"type": "redacted_thinking", "data": block.redacted_data}
    if isinstance(block, ThinkingBlock) and block.signature:
        # With tools, the API wants the turn's thinking back as it came, signature and all.
        return {"type": "thinking", "thinking": block.thinking, "signature": block.signature}
    return None  # unsigned thinking cannot be sent back; the API would reject it


def messages_to_wire(messages: list[ProviderMessage]) -> list[WireMessage]:
    wire: list[WireMessage] = []
    for message in messages:
        blocks = [b for b in map(_block_to_wire, message.content) if b is not None]
        wire.append({"role": message.role, "content": blocks})
    return wire


def _mark_cache_prefix(request: _Request) -> None:
    """Anthropic prompt caching on what repeats from call to call and run to run.

    Breakpoints (the API takes four at most; a cached prefix is read back at
    any of them, or at a block boundary up to 20 blocks before one): the last
    tool (the tools), the system prompt, and the last block of the last
    message.  Within a run each model call repeats the previous call's
    messages; from run to run the history repeats too (earlier turns as
    tool blocks, as they were sent: ``agent_runner.conversation``), so this
    call's whole prompt is the prefix the next call and the next run read.
    """
    ephemeral: CacheControl = {"type": "ephemeral"}
    if request.get("tools"):
        request["tools"][-1]["cache_control"] = ephemeral
    if request.get("system"):
        request["system"][-1]["cache_control"] = ephemeral
    content = request["messages"][-1]["content"] if request["messages"] else []
    last = content[-1] if content else None
    if last is not None and last["type"] in ("text", "tool_use", "tool_result"):  # thinking takes no breakpoint
        last["cache_control"] = ephemeral


def _block_from_wire(block: Any) -> ContentBlock | None:
    """A content block of a whole (non-streamed) answer."""
    kind = block.get("type") if isinstance(block, dict) else None
    if kind == "text":
        return TextBlock(text=str(block["text"]))
    if kind == "tool_use":
        return ToolUseBlock(id=str(block["id"]), name=str(block["name"]), input=dict(block.get("input") or {}))
    if kind == "thinking":
        return ThinkingBlock(thinking=str(block["thinking"]), signature=block.get("signature"))
    if kind == "redacted_thinking":
        return ThinkingBlock(thinking="", redacted_data=str(block["data"]))
    log.info("ignoring unsupported content block type %r", kind)
    return None


def _count(usage: JsonObject, key: str) -> int:
    value = usage.get(key)
    return value if isinstance(value, int) else 0


def _usage_from_wire(usage: Any) -> TokenUsage:
    if not isinstance(usage, dict):
        return TokenUsage()
    # Cached prompt tokens are still prompt tokens processed for this run.
    cache_read = _count(usage, "cache_read_input_tokens")
    cache_creation = _count(usage, "cache_creation_input_tokens")
    prompt = _count(usage, "input_tokens") + cache_read + cache_creation
    return TokenUsage(
        input_tokens=prompt,
        output_tokens=_count(usage, "output_tokens"),
        cache_read_input_tokens=cache_read,
        cache_creation_input_tokens=cache_creation,
    )


def _malformed(detail: str) -> ProviderError:
    return ProviderError(f"malformed response from the Anthropic API: {detail}", retryable=False)


def response_from_json(raw: bytes) -> ProviderResponse:
    """A whole answer: what a server that ignores ``"stream": true`` sends."""
    try:
        message = json.loads(raw)
    except ValueError as exc:
        raise _malformed(f"{exc}: {raw[:300]!r}") from exc
    if not isinstance(message, dict) or not isinstance(message.get("content"), list):
        raise _malformed(f"no content list in {raw[:300]!r}")
    try:
        content = [b for b in map(_block_from_wire, message["content"]) if b is not None]
    except (KeyError, TypeError, ValueError) as exc:
        raise _malformed(f"{exc!r} in {raw[:300]!r}") from exc
    stop = message.get("stop_reason")
    return ProviderResponse(
        content=content,
        stop_reason=stop if isinstance(stop, str) else None,
        usage=_usage_from_wire(message.get("usage")),
    )


def _provider_error(exc: anthropic.AnthropicError) -> ProviderError:
    if isinstance(exc, anthropic.APIStatusError):
        status = exc.status_code
        retryable = status in (408, 429) or status >= 500
        return ProviderError(f"Anthropic API error {status}: {exc.message}", retryable=retryable, status_code=status)
    if isinstance(exc, anthropic.APIConnectionError):  # includes timeouts
        return ProviderError(f"cannot reach the Anthropic API: {exc}", retryable=True)
    return ProviderError(f"Anthropic SDK error: {exc}", retryable=False)


# Error types of the API (https://docs.anthropic.com/en/api/errors) worth another try.
RETRYABLE_ERRORS = frozenset({"overloaded_error", "api_error", "rate_limit_error", "timeout_error"})


class _Block:
    """A content block while its deltas arrive."""

    def __init__(self, start: JsonObject) -> None:
        self.start = start
        self.kind = start.get("type")
        self.parts: list[str] = []  # text, thinking or the tool input's JSON, in pieces
        self.signature: str | None = start.get("signature") if isinstance(start.get("signature"), str) else None

    def finish(self) -> ContentBlock | None:
        joined = "".join(self.parts)
        start = self.start
        if self.kind == "text":
            return TextBlock(text=str(start.get("text") or "") + joined)
        if self.kind == "thinking":
            return ThinkingBlock(thinking=str(start.get("thinking") or "") + joined, signature=self.signature)
        if self.kind == "redacted_thinking":
            return ThinkingBlock(thinking="", redacted_data=str(start.get("data") or ""))
        if self.kind == "tool_use":
            if joined.strip():
                try:
                    tool_input = json.loads(joined)
                except ValueError as exc:
                    raise _malformed(f"the input of tool call {start.get('id')!r} is not JSON: {exc}") from exc
            else:  # no input_json_delta: the input came whole (or is empty)
                tool_input = start.get("input") or {}
            if not isinstance(tool_input, dict):
                raise _malformed(f"the input of tool call {start.get('id')!r} is not a JSON object")
            return ToolUseBlock(id=str(start.get("id") or ""), name=str(start.get("name") or ""), input=tool_input)
        log.info("ignoring unsupported content block type %r", self.kind)
        return None


class MessageStream:
    """A streamed Messages API answer, put together event by event.

    The event types are the API's (https://docs.anthropic.com/en/api/messages-streaming):
    ``message_start`` (the message and its input and cache counts),
    ``content_block_start`` / ``content_block_delta`` (``text_delta``,
    ``input_json_delta``, ``thinking_delta``, ``signature_delta``) /
    ``content_block_stop``, ``message_delta`` (stop reason, final output
    count), ``message_stop``, ``ping``, and ``error`` (an overload or a
    failure mid-answer: a :class:`ProviderError`, retryable as the same
    error would be before the stream).  Event types it does not know are
    skipped, as the API asks of clients.  Each text delta goes to
    ``on_text`` as it is read.
    """

    def __init__(self, on_text: TextSink | None = None) -> None:
        self.on_text = on_text
        self.blocks: dict[int, _Block] = {}
        self.done: dict[int, ContentBlock | None] = {}
        self.usage: JsonObject = {}
        self.stop_reason: str | None = None
        self.started = False
        self.stopped = False
        self._text_index: dict[int, int] = {}  # content index -> index among the text blocks

    def event(self, name: str, data: str) -> None:
        try:
            payload = json.loads(data)
        except ValueError as exc:
            raise _malformed(f"event {name!r} is not JSON: {data[:300]!r}") from exc
        if not isinstance(payload, dict):
            raise _malformed(f"event {name!r} is not a JSON object: {data[:300]!r}")
        kind = payload.get("type", name)
        try:
            self._apply(kind, payload)
        except (KeyError, TypeError, AttributeError) as exc:
            raise _malformed(f"event {kind!r}: {exc!r} in {data[:300]!r}") from exc

    def _apply(self, kind: Any, payload: JsonObject) -> None:  # noqa: C901 - one branch per event type of the Messages API's stream
        if kind == "error":
            found = payload.get("error")
            error: JsonObject = found if isinstance(found, dict) else {}
            err_type = str(error.get("type") or "error")
            raise ProviderError(
                f"Anthropic API error mid-answer ({err_type}): {error.get('message', '')}",
                retryable=err_type in RETRYABLE_ERRORS,
            )
        if kind == "message_start":
            self.started = True
            usage = payload["message"].get("usage")
            if isinstance(usage, dict):
                self.usage.update(usage)
        elif kind == "content_block_start":
            index = int(payload["index"])
            block = payload["content_block"]
            if not isinstance(block, dict):
                raise TypeError("content_block is not an object")
            self.blocks[index] = _Block(block)
            if block.get("type") == "text":
                self._text_index[index] = len(self._text_index)
                if block.get("text"):
                    self._show(index, str(block["text"]))
        elif kind == "content_block_delta":
            index = int(payload["index"])
            delta = payload["delta"]
            target = self.blocks[index]
            dtype = delta.get("type")
            if dtype == "text_delta":
                target.parts.append(str(delta["text"]))
                self._show(index, str(delta["text"]))
            elif dtype == "input_json_delta":
                target.parts.append(str(delta["partial_json"]))
            elif dtype == "thinking_delta":
                target.parts.append(str(delta["thinking"]))
            elif dtype == "signature_delta":
                target.signature = str(delta["signature"])
        elif kind == "content_block_stop":
            index = int(payload["index"])
            self.done[index] = self.blocks.pop(index).finish()
        elif kind == "message_delta":
            stop = payload.get("delta", {}).get("stop_reason")
            if isinstance(stop, str):
                self.stop_reason = stop
            usage = payload.get("usage")
            if isinstance(usage, dict):
                # The final counts; fields it leaves out (or null) keep message_start's.
                self.usage.update({k: v for k, v in usage.items() if v is not None})
        elif kind == "message_stop":
            self.stopped = True
        # ping and event types added later: nothing to do

    def _show(self, index: int, text: str) -> None:
        if self.on_text is not None and text:
            self.on_text(self._text_index[index], text)

    def response(self) -> ProviderResponse:
        """The whole answer; a stream cut before ``message_stop`` is a retryable error."""
        if not self.stopped:
            raise ProviderError("the Anthropic API's answer stream ended before message_stop", retryable=True)
        if self.blocks:
            raise _malformed(f"content blocks {sorted(self.blocks)} were never closed")
        content = [b for _, b in sorted(self.done.items()) if b is not None]
        return ProviderResponse(content=content, stop_reason=self.stop_reason, usage=_usage_from_wire(self.usage))


class AnthropicProvider:
    """:class:`Provider` backed by ``client.messages.create``.

    ``api_key`` is for host-side use and tests only; inside the container it
    stays ``None`` and the placeholder is sent.
    """

    def __init__(
        self,
        settings: ModelSettings,
        *,
        api_key: str | None = None,
        max_retries: int = MAX_RETRIES,
        timeout_s: float = REQUEST_TIMEOUT_S,
    ) -> None:
        self.settings = settings
        http_client = None
        if settings.socket_path:
            base_url: str | None = GATEWAY_BASE_URL
            http_client = _unix_socket_client(settings.socket_path)
        elif settings.base_url:
            base_url = settings.base_url
        elif api_key:
            base_url = None  # the SDK's default endpoint, with a real key
        else:
            raise InputError("the anthropic provider needs model.socket_path (key-injecting gateway) or model.base_url")
        http = _sdk_http_module()
        self._stream_errors: tuple[type[Exception], ...] = (http.HTTPError, http.StreamError)
        self._client = anthropic.Anthropic(
            api_key=api_key or PLACEHOLDER_API_KEY,
            base_url=base_url,
            http_client=http_client,
            max_retries=max_retries,
            timeout=timeout_s,
        )

    def complete(
        self, system: str, messages: list[ProviderMessage], tools: list[ToolSpec], on_text: TextSink | None = None
    ) -> ProviderResponse:
        request: _Request = {
            "model": self.settings.model,
            "max_tokens": self.settings.max_tokens,
            "messages": messages_to_wire(messages),
        }
        if system:
            # A list of blocks rather than a string: a block can carry a cache breakpoint.
            request["system"] = [{"type": "text", "text": system}]
        if tools:
            request["tools"] = [
                {"name": t.name, "description": t.description, "input_schema": t.input_schema} for t in tools
            ]
        budget = self.settings.thinking_budget
        if budget is not msgspec.UNSET:
            # Extended thinking: the answer's thinking comes first, as thinking blocks.
            request["thinking"] = {"type": "enabled", "budget_tokens": budget}
        _mark_cache_prefix(request)
        try:
            # The SDK's retries and error mapping for the request; the event
            # stream is read here, as it arrives (:class:`MessageStream`).
            # The SDK names these shapes with its own *Param TypedDicts (see above).
            create = self._client.messages.with_streaming_response.create
            with create(**request, stream=True) as response:  # type: ignore[arg-type]
                if not response.headers.get("content-type", "").startswith("text/event-stream"):
                    return response_from_json(response.read())  # a server that does not stream
                stream = MessageStream(on_text)
                decoder = SseDecoder()
                for chunk in response.iter_bytes():
                    for event in decoder.feed(chunk):
                        stream.event(event.event, event.data)
                return stream.response()
        except anthropic.AnthropicError as exc:
            raise _provider_error(exc) from exc
        except SseError as exc:
            raise _malformed(str(exc)) from exc
        except self._stream_errors as exc:  # the connection broke mid-answer
            raise ProviderError(f"the Anthropic API's answer stream broke: {exc!r}", retryable=True) from exc
