"""A Chat Completions answer as our blocks: a whole ``chat.completion`` body, or a stream.

The answer's ``chat.completion.chunk`` events are put together as they arrive
(:class:`ChunkStream`): text deltas go to the loop's ``on_text`` at once, ``tool_calls``
fragments are joined by their ``index``, the usage comes in the last chunk, ``data:
[DONE]`` ends it.  A server that answers with a whole ``chat.completion`` JSON instead
(it ignores ``stream``) is read as one (:func:`response_from_wire`).

Translation back: ``message.content`` -> text, ``reasoning_content`` / ``reasoning``
(vLLM, llama.cpp, Ollama) -> thinking, ``tool_calls`` -> tool uses
(``openai_tool_calls.py``), ``usage.prompt_tokens`` / ``completion_tokens`` -> usage,
``finish_reason`` -> stop reason (``tool_calls`` -> ``tool_use``, ``stop`` ->
``end_turn``, ``length`` -> ``max_tokens``; ``tool_use`` whenever tools are called).

A 200 whose body is not JSON or has no ``choices`` is a non-retryable error quoting the
body; so is a stream event that is not a JSON object.  An ``{"error": ...}`` event
mid-stream is an error, retryable unless its type says otherwise.
"""

from __future__ import annotations

import json
from typing import Any

from ..errors import ProviderError
from ..protocol import JsonObject
from .base import ContentBlock, ProviderResponse, TextBlock, TextSink, ThinkingBlock, TokenUsage
from .openai_errors import error_detail, snippet
from .openai_tool_calls import CallParts, tool_use

STOP_REASONS = {"tool_calls": "tool_use", "function_call": "tool_use", "stop": "end_turn", "length": "max_tokens"}
DONE = "[DONE]"
# Error types a server names in an ``{"error": ...}`` event that another try may get past.
RETRYABLE_STREAM_ERRORS = frozenset(
    {"server_error", "overloaded_error", "api_error", "rate_limit_error", "rate_limit_exceeded", "timeout"}
)


def _content_text(content: Any) -> str:
    """``message.content``: a string, null, or (some servers) a list of text parts."""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "".join(p.get("text", "") for p in content if isinstance(p, dict) and isinstance(p.get("text"), str))
    return ""


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
            f"the chat completions server returned a body that is not JSON: {snippet(raw)}", retryable=False
        ) from None
    choices = body.get("choices") if isinstance(body, dict) else None
    if not isinstance(choices, list) or not choices or not isinstance(choices[0], dict):
        raise ProviderError(f"the chat completions response has no choices: {snippet(raw)}", retryable=False)
    choice = choices[0]
    message = choice.get("message")
    if not isinstance(message, dict):
        raise ProviderError(f"the chat completions choice has no message: {snippet(raw)}", retryable=False)

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
        raise ProviderError(f"tool_calls is not a list: {snippet(raw)}", retryable=False)
    uses = [tool_use(call, i) for i, call in enumerate(calls)]
    content.extend(uses)

    finish = choice.get("finish_reason")
    stop_reason = "tool_use" if uses else STOP_REASONS.get(finish, finish) if isinstance(finish, str) else None
    return ProviderResponse(content=content, stop_reason=stop_reason, usage=_usage(body))


# ---------------------------------------------------------------------------
# A streamed answer
# ---------------------------------------------------------------------------


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
        self.calls: dict[int, CallParts] = {}
        self.finish: str | None = None
        self.usage: JsonObject | None = None
        self.done = False
        self.shown = False  # some text went to on_text

    def event(self, data: str) -> None:  # noqa: C901 - one branch per field a chunk may carry
        if data.strip() == DONE:
            self.done = True
            return
        try:
            chunk = json.loads(data)
        except ValueError:
            raise ProviderError(
                f"the chat completions stream sent an event that is not JSON: {snippet(data)}", retryable=False
            ) from None
        if not isinstance(chunk, dict):
            raise ProviderError(
                f"the chat completions stream sent an event that is not an object: {snippet(data)}", retryable=False
            )
        error = chunk.get("error")
        if error is not None:
            kind = error.get("type") or error.get("code") if isinstance(error, dict) else None
            raise ProviderError(
                f"chat completions error mid-stream: {error_detail(data.encode())}",
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
                self.calls.setdefault(index if isinstance(index, int) else position, CallParts()).add(fragment)

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
        uses = [tool_use(parts.wire(), i) for i, (_, parts) in enumerate(sorted(self.calls.items()))]
        content.extend(uses)
        finish = self.finish
        stop_reason = "tool_use" if uses else STOP_REASONS.get(finish, finish) if finish is not None else None
        return ProviderResponse(content=content, stop_reason=stop_reason, usage=_usage({"usage": self.usage}))
