"""OpenAI-compatible Chat Completions: Ollama, vLLM, llama.cpp's server, OpenAI.

One streamed ``POST {base}/v1/chat/completions`` per model call
(``"stream": true`` with ``stream_options.include_usage``), with our tools
offered as function tools.  Plain HTTP (``httpx2``, which the
Anthropic SDK brings into the image, or ``httpx``), no SDK: the ``openai``
SDK measured about 1.1 s more CPU per cold run (the runner is a new process
for each) and 19 MB more in every image (docs/performance.md, "The openai
SDK for the openai provider").  This module is the provider: where requests go
and what is retried.  The rest, one concept a module:

* ``openai_request.py``: our blocks as the request's messages and tools;
* ``openai_response.py``: the answer (a stream, or a whole body) as our blocks;
* ``openai_tool_calls.py``: tool calls both ways, and arguments that are not JSON;
* ``openai_errors.py``: the server's words quoted in our errors.

Where the requests go, as for the Anthropic provider, and never with a key
from the container:

* ``socket_path`` set: the host's model gateway on a unix socket, which adds
  ``Authorization: Bearer <key>`` when the host has a key and forwards the
  one route to the configured server;
* else ``base_url``: a keyless server (a local Ollama, a fake in tests).  The
  server's root, e.g. ``http://127.0.0.1:11434``; a trailing ``/v1`` is
  accepted too (the OpenAI SDK's convention).

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
from collections.abc import Callable
from typing import Any

from ..errors import InputError, ProviderError
from ..protocol import ModelSettings
from ..sse import SseDecoder, SseError
from .base import ProviderMessage, ProviderResponse, TextSink, ToolSpec
from .openai_errors import error_detail
from .openai_request import ChatRequest, messages_to_wire, tools_to_wire
from .openai_response import ChunkStream, response_from_wire

log = logging.getLogger(__name__)

GATEWAY_BASE_URL = "http://gateway"
CHAT_PATH = "/v1/chat/completions"
MAX_RETRIES = 3
BACKOFF_BASE_S = 0.5
BACKOFF_MAX_S = 8.0
RETRY_AFTER_CAP_S = 30.0
REQUEST_TIMEOUT_S = 600.0
CONNECT_TIMEOUT_S = 10.0


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
                        f"chat completions error {status}: {error_detail(body)}",
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
