"""OpenAI-compatible Chat Completions: Ollama, vLLM, llama.cpp's server, OpenAI.

One streamed ``POST {base}/v1/chat/completions`` per model call
(``"stream": true`` with ``stream_options.include_usage``), with our tools
offered as function tools.  The answer's ``chat.completion.chunk`` events
are put together as they arrive (:class:`ChunkStream`): text deltas go to
the loop's ``on_text`` at once, ``tool_calls`` fragments are joined by
their ``index``, the usage comes in the last chunk, ``data: [DONE]`` ends
it.  A server that answers with a whole ``chat.completion`` JSON instead
(it ignores ``stream``) is read as one.  Plain HTTP (``httpx2``, which the
Anthropic SDK brings into the image, or ``httpx``), no SDK: the ``openai``
SDK measured about 1.1 s more CPU per cold run (the runner is a new process
for each) and 19 MB more in every image (docs/performance.md, "The openai
SDK for the openai provider").

Where the requests go, as for the Anthropic provider, and never with a key
from the container:

* ``socket_path`` set: the host's model gateway on a unix socket, which adds
  ``Authorization: Bearer <key>`` when the host has a key and forwards the
  one route to the configured server;
* else ``base_url``: a keyless server (a local Ollama, a fake in tests).  The
  server's root, e.g. ``http://127.0.0.1:11434``; a trailing ``/v1`` is
  accepted too (the OpenAI SDK's convention).

Translation (our blocks mirror Anthropic's):

* the system prompt -> the first message, ``role: "system"``;
* assistant text -> ``content``; assistant tool calls -> ``tool_calls`` with
  the input as a JSON string; thinking is not sent back (Chat Completions
  has no field for it);
* tool results -> one ``role: "tool"`` message each, with ``tool_call_id``,
  right after the assistant turn that called them (the API requires that);
  other user text follows as a ``user`` message;
* back: ``message.content`` -> text, ``reasoning_content`` / ``reasoning``
  (vLLM, llama.cpp, Ollama) -> thinking, ``tool_calls`` -> tool uses,
  ``usage.prompt_tokens`` / ``completion_tokens`` -> usage, ``finish_reason``
  -> stop reason (``tool_calls`` -> ``tool_use``, ``stop`` -> ``end_turn``,
  ``length`` -> ``max_tokens``; ``tool_use`` whenever tools are called).

A tool call whose ``arguments`` are not a JSON object (small local models do
this) does not end the run: the call's input becomes ``{"_raw": <the
arguments>}``, the tool then refuses it as an error result, and that result
is sent back prefixed with a note that the arguments were not valid JSON, so
the model can call again correctly.

Retries: 408, 429, 5xx and connection errors are retried ``max_retries``
times with exponential backoff and jitter, or after ``Retry-After`` (capped)
when the server sends it; then a retryable :class:`ProviderError`, and the
host's own retries take over.  Other 4xx are not retried.  A 200 whose body
is not JSON or has no ``choices`` is a non-retryable error quoting the body.
A stream that breaks, or ends without a finish reason or ``[DONE]``, is
retried the same way while none of its text was shown yet; after that it
is a retryable :class:`ProviderError` (the text already shown would be
shown twice).  An ``{"error": ...}`` event mid-stream is an error too.
"""

from __future__ import annotations

import email.utils
import importlib
import json
import logging
import random
import time
import uuid
from collections.abc import Callable
from typing import Any, Literal, NotRequired, TypedDict, Union

from ..errors import InputError, ProviderError
from ..protocol import JsonObject, ModelSettings
from .base import (
    ContentBlock,
    ImageBlock,
    ProviderMessage,
    ProviderResponse,
    TextBlock,
    TextSink,
    ThinkingBlock,
    TokenUsage,
    ToolResultBlock,
    ToolSpec,
    ToolUseBlock,
    render_tool_result,
)
from .sse import SseDecoder, SseError

log = logging.getLogger(__name__)

GATEWAY_BASE_URL = "http://gateway"
CHAT_PATH = "/v1/chat/completions"
MAX_RETRIES = 3
BACKOFF_BASE_S = 0.5
BACKOFF_MAX_S = 8.0
RETRY_AFTER_CAP_S = 30.0
REQUEST_TIMEOUT_S = 600.0
CONNECT_TIMEOUT_S = 10.0
SNIPPET_CHARS = 300
# Input of a tool call whose arguments were not a JSON object.
RAW_ARGUMENTS_KEY = "_raw"
INVALID_ARGUMENTS_NOTE = "[the arguments of this call were not a valid JSON object: {raw}]"
STOP_REASONS = {"tool_calls": "tool_use", "function_call": "tool_use", "stop": "end_turn", "length": "max_tokens"}


def _http_module() -> Any:
    """``httpx2`` (what the image has, via the Anthropic SDK) or ``httpx``."""
    for name in ("httpx2", "httpx"):
        try:
            return importlib.import_module(name)
        except ImportError:
            continue
    raise ImportError("neither httpx2 nor httpx is installed")


def server_root(base_url: str) -> str:
    """``base_url`` without a trailing slash or ``/v1`` (we add ``/v1/chat/completions``)."""
    root = base_url.rstrip("/")
    return root[: -len("/v1")] if root.endswith("/v1") else root


def is_retryable_status(status: int) -> bool:
    return status in (408, 429) or status >= 500


def _snippet(raw: bytes | str) -> str:
    text = raw.decode("utf-8", "replace") if isinstance(raw, bytes) else raw
    text = " ".join(text.split())
    if not text:
        return "(empty body)"
    return text if len(text) <= SNIPPET_CHARS else text[: SNIPPET_CHARS - 1] + "…"


def retry_after_s(headers: Any, now: float | None = None) -> float | None:
    """Seconds the server asks us to wait (``retry-after-ms``, ``Retry-After``), or None."""
    ms = headers.get("retry-after-ms")
    if ms:
        try:
            return max(0.0, float(ms) / 1000)
        except ValueError:
            pass
    value = headers.get("retry-after")
    if not value:
        return None
    try:
        return max(0.0, float(value))
    except ValueError:
        pass
    try:  # an HTTP date
        when = email.utils.parsedate_to_datetime(value).timestamp()
    except (TypeError, ValueError):
        return None
    return max(0.0, when - (time.time() if now is None else now))


def _error_detail(raw: bytes) -> str:
    """The server's error message: OpenAI's ``{"error": {"message"}}``, Ollama's, vLLM's, or the body."""
    try:
        body = json.loads(raw)
    except ValueError:
        return _snippet(raw)
    if isinstance(body, dict):
        error = body.get("error")
        if isinstance(error, dict) and isinstance(message := error.get("message"), str):
            return message
        if isinstance(error, str):
            return error
        if isinstance(message := body.get("message"), str):
            return message
    return _snippet(raw)


# ---------------------------------------------------------------------------
# Our blocks -> Chat Completions messages
# ---------------------------------------------------------------------------


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


def _raw_arguments(call: ToolUseBlock) -> str | None:
    raw = call.input.get(RAW_ARGUMENTS_KEY)
    return raw if set(call.input) == {RAW_ARGUMENTS_KEY} and isinstance(raw, str) else None


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
        if isinstance(b, ToolUseBlock) and (raw := _raw_arguments(b)) is not None
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


# ---------------------------------------------------------------------------
# A Chat Completions response -> our blocks
# ---------------------------------------------------------------------------


def _content_text(content: Any) -> str:
    """``message.content``: a string, null, or (some servers) a list of text parts."""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "".join(p.get("text", "") for p in content if isinstance(p, dict) and isinstance(p.get("text"), str))
    return ""


def _tool_input(name: str, arguments: Any) -> JsonObject:
    if isinstance(arguments, dict):  # a few servers send an object, not a string
        return arguments
    if arguments is None or (isinstance(arguments, str) and not arguments.strip()):
        return {}
    try:
        parsed = json.loads(arguments) if isinstance(arguments, str) else None
    except ValueError:
        parsed = None
    if isinstance(parsed, dict):
        return parsed
    raw = arguments if isinstance(arguments, str) else json.dumps(arguments)
    log.warning("tool call %s: arguments are not a JSON object: %s", name, _snippet(raw))
    return {RAW_ARGUMENTS_KEY: raw}


def _tool_use(call: Any, index: int) -> ToolUseBlock:
    function = call.get("function") if isinstance(call, dict) else None
    if not isinstance(function, dict) or not isinstance(function.get("name"), str):
        raise ProviderError(f"tool call without a function name: {_snippet(json.dumps(call))}", retryable=False)
    call_id = call.get("id")
    if not isinstance(call_id, str) or not call_id:
        call_id = f"call_{index}_{uuid.uuid4().hex[:12]}"  # some servers omit it; we need one to answer
    name = function["name"]
    return ToolUseBlock(id=call_id, name=name, input=_tool_input(name, function.get("arguments")))


def _usage(body: JsonObject) -> TokenUsage:
    usage = body.get("usage")
    if not isinstance(usage, dict):
        return TokenUsage()
    return TokenUsage(
        input_tokens=int(usage.get("prompt_tokens") or 0),
        output_tokens=int(usage.get("completion_tokens") or 0),
    )


def response_from_wire(raw: bytes) -> ProviderResponse:
    """Parse a 200 response body; a body we cannot use is a non-retryable ProviderError."""
    try:
        body = json.loads(raw)
    except ValueError:
        raise ProviderError(
            f"the chat completions server returned a body that is not JSON: {_snippet(raw)}", retryable=False
        ) from None
    choices = body.get("choices") if isinstance(body, dict) else None
    if not isinstance(choices, list) or not choices or not isinstance(choices[0], dict):
        raise ProviderError(f"the chat completions response has no choices: {_snippet(raw)}", retryable=False)
    choice = choices[0]
    message = choice.get("message")
    if not isinstance(message, dict):
        raise ProviderError(f"the chat completions choice has no message: {_snippet(raw)}", retryable=False)

    content: list[ContentBlock] = []
    for key in ("reasoning_content", "reasoning"):
        thinking = message.get(key)
        if isinstance(thinking, str) and thinking.strip():
            content.append(ThinkingBlock(thinking=thinking))
            break
    text = _content_text(message.get("content"))
    if text:
        content.append(TextBlock(text=text))
    calls = message.get("tool_calls") or []
    if not isinstance(calls, list):
        raise ProviderError(f"tool_calls is not a list: {_snippet(raw)}", retryable=False)
    uses = [_tool_use(call, i) for i, call in enumerate(calls)]
    content.extend(uses)

    finish = choice.get("finish_reason")
    stop_reason = "tool_use" if uses else STOP_REASONS.get(finish, finish) if isinstance(finish, str) else None
    return ProviderResponse(content=content, stop_reason=stop_reason, usage=_usage(body))


# ---------------------------------------------------------------------------
# A streamed answer -> our blocks
# ---------------------------------------------------------------------------

DONE = "[DONE]"
# Error types a server names in an ``{"error": ...}`` event that another try may get past.
RETRYABLE_STREAM_ERRORS = frozenset(
    {"server_error", "overloaded_error", "api_error", "rate_limit_error", "rate_limit_exceeded", "timeout"}
)


class _CallParts:
    """One tool call while its fragments arrive: the id and name come once, the arguments in pieces."""

    def __init__(self) -> None:
        self.id: str | None = None
        self.name: str | None = None
        self.arguments: list[str] = []

    def add(self, fragment: JsonObject) -> None:
        if isinstance(fragment.get("id"), str) and fragment["id"]:
            self.id = fragment["id"]
        function = fragment.get("function")
        if isinstance(function, dict):
            if isinstance(function.get("name"), str) and function["name"]:
                self.name = function["name"]
            if isinstance(function.get("arguments"), str):
                self.arguments.append(function["arguments"])
            elif isinstance(function.get("arguments"), dict):  # a few servers send an object whole
                self.arguments.append(json.dumps(function["arguments"]))

    def wire(self) -> JsonObject:
        function: JsonObject = {"arguments": "".join(self.arguments)}
        if self.name is not None:
            function["name"] = self.name
        return {"id": self.id, "type": "function", "function": function}


class ChunkStream:
    """A streamed Chat Completions answer, put together chunk by chunk (``data:`` events).

    Each chunk's ``choices[0].delta`` may carry ``content`` (text, handed to
    ``on_text`` at once), ``reasoning_content`` / ``reasoning`` (thinking)
    and ``tool_calls`` fragments (joined by ``index``); ``finish_reason``
    comes with the last choice chunk, ``usage`` with a last chunk of its own
    (``choices: []``), ``[DONE]`` ends the stream.
    """

    def __init__(self, on_text: TextSink | None = None) -> None:
        self.on_text = on_text
        self.text: list[str] = []
        self.thinking: list[str] = []
        self.calls: dict[int, _CallParts] = {}
        self.finish: str | None = None
        self.usage: JsonObject | None = None
        self.done = False
        self.shown = False  # some text went to on_text

    def event(self, data: str) -> None:
        if data.strip() == DONE:
            self.done = True
            return
        try:
            chunk = json.loads(data)
        except ValueError:
            raise ProviderError(
                f"the chat completions stream sent an event that is not JSON: {_snippet(data)}", retryable=False
            ) from None
        if not isinstance(chunk, dict):
            raise ProviderError(
                f"the chat completions stream sent an event that is not an object: {_snippet(data)}", retryable=False
            )
        error = chunk.get("error")
        if error is not None:
            kind = error.get("type") or error.get("code") if isinstance(error, dict) else None
            raise ProviderError(
                f"chat completions error mid-stream: {_error_detail(data.encode())}",
                retryable=kind in RETRYABLE_STREAM_ERRORS or kind is None,
            )
        if isinstance(chunk.get("usage"), dict):
            self.usage = chunk["usage"]
        choices = chunk.get("choices")
        if not isinstance(choices, list) or not choices or not isinstance(choices[0], dict):
            return  # the usage chunk, or a keep-alive some servers send
        choice = choices[0]
        if isinstance(choice.get("finish_reason"), str):
            self.finish = choice["finish_reason"]
        delta = choice.get("delta")
        if not isinstance(delta, dict):
            return
        for key in ("reasoning_content", "reasoning"):
            if isinstance(delta.get(key), str):
                self.thinking.append(delta[key])
                break
        text = _content_text(delta.get("content"))
        if text:
            self.text.append(text)
            if self.on_text is not None:
                self.shown = True
                self.on_text(0, text)
        fragments = delta.get("tool_calls")
        if isinstance(fragments, list):
            for position, fragment in enumerate(fragments):
                if not isinstance(fragment, dict):
                    continue
                index = fragment.get("index")
                self.calls.setdefault(index if isinstance(index, int) else position, _CallParts()).add(fragment)

    @property
    def complete(self) -> bool:
        """Ended as a stream should: ``[DONE]``, or at least a finish reason (servers that skip ``[DONE]``)."""
        return self.done or self.finish is not None

    def response(self) -> ProviderResponse:
        content: list[ContentBlock] = []
        thinking = "".join(self.thinking)
        if thinking.strip():
            content.append(ThinkingBlock(thinking=thinking))
        text = "".join(self.text)
        if text:
            content.append(TextBlock(text=text))
        uses = [_tool_use(parts.wire(), i) for i, (_, parts) in enumerate(sorted(self.calls.items()))]
        content.extend(uses)
        finish = self.finish
        stop_reason = "tool_use" if uses else STOP_REASONS.get(finish, finish) if finish is not None else None
        return ProviderResponse(content=content, stop_reason=stop_reason, usage=_usage({"usage": self.usage}))


# ---------------------------------------------------------------------------
# The provider
# ---------------------------------------------------------------------------


class OpenAICompatProvider:
    """:class:`Provider` over ``POST /v1/chat/completions`` (see the module docstring).

    ``api_key`` is for host-side use and tests only; inside the container it
    stays ``None`` and no ``Authorization`` header is sent.  ``sleep`` and
    ``rng`` are injectable so tests can check the backoff without waiting.
    """

    def __init__(
        self,
        settings: ModelSettings,
        *,
        api_key: str | None = None,
        max_retries: int = MAX_RETRIES,
        backoff_base_s: float = BACKOFF_BASE_S,
        backoff_max_s: float = BACKOFF_MAX_S,
        retry_after_cap_s: float = RETRY_AFTER_CAP_S,
        timeout_s: float = REQUEST_TIMEOUT_S,
        sleep: Callable[[float], None] = time.sleep,
        rng: random.Random | None = None,
    ) -> None:
        self.settings = settings
        self.max_retries = max_retries
        self.backoff_base_s = backoff_base_s
        self.backoff_max_s = backoff_max_s
        self.retry_after_cap_s = retry_after_cap_s
        self._sleep = sleep
        self._rng = rng or random.Random()
        self._http = _http_module()
        transport = None
        if settings.socket_path:
            base = GATEWAY_BASE_URL
            transport = self._http.HTTPTransport(uds=settings.socket_path)
        elif settings.base_url:
            base = server_root(settings.base_url)
        else:
            raise InputError("the openai provider needs model.socket_path (key-injecting gateway) or model.base_url")
        headers = {"content-type": "application/json", "accept": "application/json"}
        if api_key:
            headers["authorization"] = f"Bearer {api_key}"
        self._client = self._http.Client(
            base_url=base,
            transport=transport,
            headers=headers,
            timeout=self._http.Timeout(timeout_s, connect=CONNECT_TIMEOUT_S),
            # No proxy from the environment: the gateway socket or a local server.
            trust_env=False,
        )

    def close(self) -> None:
        self._client.close()

    def request_body(self, system: str, messages: list[ProviderMessage], tools: list[ToolSpec]) -> ChatRequest:
        body: ChatRequest = {
            "model": self.settings.model,
            "messages": messages_to_wire(system, messages),
            "max_tokens": self.settings.max_tokens,
            "stream": True,
            "stream_options": {"include_usage": True},
        }
        if tools:
            body["tools"] = tools_to_wire(tools)
        return body

    def complete(
        self, system: str, messages: list[ProviderMessage], tools: list[ToolSpec], on_text: TextSink | None = None
    ) -> ProviderResponse:
        payload = json.dumps(self.request_body(system, messages, tools), ensure_ascii=False).encode()
        attempt = 0
        while True:
            outcome, retry_after = self._attempt(payload, on_text)
            if isinstance(outcome, ProviderResponse):
                return outcome
            if not outcome.retryable or attempt >= self.max_retries:
                if outcome.retryable and attempt:
                    raise ProviderError(
                        f"{outcome} (gave up after {attempt + 1} attempts)",
                        retryable=True,
                        status_code=outcome.status_code,
                    ) from outcome
                raise outcome
            delay = self._delay(attempt, retry_after)
            log.warning("%s; retry %d/%d in %.2fs", outcome, attempt + 1, self.max_retries, delay)
            self._sleep(delay)
            attempt += 1

    def _attempt(
        self, payload: bytes, on_text: TextSink | None = None
    ) -> tuple[ProviderResponse | ProviderError, float | None]:
        """One request: the response, or the error and the server's Retry-After.

        A 2xx body we cannot use raises at once (retrying would get the same),
        and so does a stream that breaks after some of its text was shown.
        """
        stream: ChunkStream | None = None
        try:
            with self._client.stream("POST", CHAT_PATH, content=payload) as resp:
                status = resp.status_code
                if not 200 <= status < 300:
                    body = resp.read()
                    error = ProviderError(
                        f"chat completions error {status}: {_error_detail(body)}",
                        retryable=is_retryable_status(status),
                        status_code=status,
                    )
                    return error, retry_after_s(resp.headers)
                if not resp.headers.get("content-type", "").startswith("text/event-stream"):
                    return response_from_wire(resp.read()), None  # a server that does not stream
                stream = ChunkStream(on_text)
                decoder = SseDecoder()
                for chunk in resp.iter_bytes():
                    for event in decoder.feed(chunk):
                        stream.event(event.data)
                    if stream.done:
                        break
        except SseError as exc:
            raise ProviderError(f"the chat completions stream is unusable: {exc}", retryable=False) from exc
        except (self._http.TransportError, self._http.StreamError) as exc:  # refused, reset, timeouts
            if stream is None:
                return ProviderError(f"cannot reach the chat completions server: {exc!r}", retryable=True), None
            cut = ProviderError(f"the chat completions stream broke: {exc!r}", retryable=True)
            if stream.shown:
                raise cut from exc
            return cut, None
        if not stream.complete:
            cut = ProviderError("the chat completions stream ended before its finish_reason or [DONE]", retryable=True)
            if stream.shown:
                raise cut
            return cut, None
        return stream.response(), None

    def _delay(self, attempt: int, retry_after: float | None) -> float:
        if retry_after is not None:
            return min(retry_after, self.retry_after_cap_s)
        # Exponential backoff with jitter: between half and all of base * 2^n.
        ceiling = min(self.backoff_max_s, self.backoff_base_s * 2**attempt)
        return self._rng.uniform(ceiling / 2, ceiling)
