"""The Anthropic Messages API provider, through the official ``anthropic`` SDK.

No secret is ever inside the container.  The API is reached either through
a gateway on the host listening on a unix socket (``socket_path``; the
gateway injects the real key) or through ``base_url`` (a keyless local or
fake server).  The SDK insists on some key, so a placeholder is sent and the
gateway overwrites it.
"""

from __future__ import annotations

import importlib
import logging
from typing import Any, Literal, NotRequired, TypedDict, Union

import anthropic
import msgspec

from ..errors import InputError, ProviderError
from ..protocol import JsonObject, ModelSettings
from .base import (
    ContentBlock,
    ProviderMessage,
    ProviderResponse,
    Role,
    TextBlock,
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


class TextWire(TypedDict):
    type: Literal["text"]
    text: str


class ToolUseWire(TypedDict):
    type: Literal["tool_use"]
    id: str
    name: str
    input: JsonObject


class ToolResultWire(TypedDict):
    type: Literal["tool_result"]
    tool_use_id: str
    content: str
    is_error: bool


class ThinkingWire(TypedDict):
    type: Literal["thinking"]
    thinking: str
    signature: str


class RedactedThinkingWire(TypedDict):
    type: Literal["redacted_thinking"]
    data: str


WireBlock = Union[TextWire, ToolUseWire, ToolResultWire, ThinkingWire, RedactedThinkingWire]


class WireMessage(TypedDict):
    role: Role
    content: list[WireBlock]


class WireTool(TypedDict):
    name: str
    description: str
    input_schema: JsonObject


class ThinkingConfig(TypedDict):
    type: Literal["enabled"]
    budget_tokens: int


class _Request(TypedDict):
    model: str
    max_tokens: int
    system: str
    messages: list[WireMessage]
    tools: NotRequired[list[WireTool]]  # only when there are tools
    thinking: NotRequired[ThinkingConfig]  # only when a thinking budget is set


def _block_to_wire(block: ContentBlock) -> WireBlock | None:
    if isinstance(block, TextBlock):
        return {"type": "text", "text": block.text}
    if isinstance(block, ToolUseBlock):
        return {"type": "tool_use", "id": block.id, "name": block.name, "input": block.input}
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


def _block_from_sdk(block: Any) -> ContentBlock | None:
    kind = getattr(block, "type", None)
    if kind == "text":
        return TextBlock(text=block.text)
    if kind == "tool_use":
        return ToolUseBlock(id=block.id, name=block.name, input=dict(block.input or {}))
    if kind == "thinking":
        return ThinkingBlock(thinking=block.thinking, signature=getattr(block, "signature", None))
    if kind == "redacted_thinking":
        return ThinkingBlock(thinking="", redacted_data=block.data)
    log.info("ignoring unsupported content block type %r", kind)
    return None


def _usage_from_sdk(usage: Any) -> TokenUsage:
    # Cached prompt tokens are still prompt tokens processed for this run.
    cache_read = getattr(usage, "cache_read_input_tokens", None) or 0
    cache_creation = getattr(usage, "cache_creation_input_tokens", None) or 0
    prompt = (getattr(usage, "input_tokens", None) or 0) + cache_read + cache_creation
    return TokenUsage(input_tokens=prompt, output_tokens=getattr(usage, "output_tokens", 0) or 0,
                      cache_read_input_tokens=cache_read, cache_creation_input_tokens=cache_creation)


def _provider_error(exc: anthropic.AnthropicError) -> ProviderError:
    if isinstance(exc, anthropic.APIStatusError):
        status = exc.status_code
        retryable = status in (408, 429) or status >= 500
        return ProviderError(
            f"Anthropic API error {status}: {exc.message}", retryable=retryable, status_code=status
        )
    if isinstance(exc, anthropic.APIConnectionError):  # includes timeouts
        return ProviderError(f"cannot reach the Anthropic API: {exc}", retryable=True)
    return ProviderError(f"Anthropic SDK error: {exc}", retryable=False)


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
            raise InputError(
                "the anthropic provider needs model.socket_path (key-injecting gateway) "
                "or model.base_url"
            )
        self._client = anthropic.Anthropic(
            api_key=api_key or PLACEHOLDER_API_KEY,
            base_url=base_url,
            http_client=http_client,
            max_retries=max_retries,
            timeout=timeout_s,
        )

    def complete(
        self, system: str, messages: list[ProviderMessage], tools: list[ToolSpec]
    ) -> ProviderResponse:
        request: _Request = {
            "model": self.settings.model,
            "max_tokens": self.settings.max_tokens,
            "system": system,
            "messages": messages_to_wire(messages),
        }
        if tools:
            request["tools"] = [
                {"name": t.name, "description": t.description, "input_schema": t.input_schema}
                for t in tools
            ]
        budget = self.settings.thinking_budget
        if budget is not msgspec.UNSET:
            # Extended thinking: the answer's thinking comes first, as thinking blocks.
            request["thinking"] = {"type": "enabled", "budget_tokens": budget}
        try:
            # The SDK names these shapes with its own *Param TypedDicts (see above).
            message = self._client.messages.create(**request)  # type: ignore[arg-type]
        except anthropic.AnthropicError as exc:
            raise _provider_error(exc) from exc
        except ValueError as exc:  # a 200 whose body is not JSON (a proxy's page, a cut-off body)
            raise ProviderError(f"malformed response from the Anthropic API: {exc}", retryable=False) from exc
        if not isinstance(getattr(message, "content", None), list):
            raise ProviderError(
                f"malformed response from the Anthropic API: no content list in {str(message)[:300]!r}",
                retryable=False,
            )
        try:
            content = [b for b in map(_block_from_sdk, message.content) if b is not None]
            usage = _usage_from_sdk(message.usage)
        except (AttributeError, TypeError, ValueError) as exc:
            raise ProviderError(f"malformed response from the Anthropic API: {exc}", retryable=False) from exc
        return ProviderResponse(content=content, stop_reason=message.stop_reason, usage=usage)
