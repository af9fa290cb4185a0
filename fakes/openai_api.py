"""A fake OpenAI-compatible Chat Completions server speaking the real wire format.

``FakeOpenAI`` plays a script of replies to ``POST /v1/chat/completions``
and records every request it gets (method, path, headers, parsed JSON body),
like :class:`fakes.anthropic_api.FakeAnthropic`.  It is thread-safe
and serves on loopback TCP (``fake.serve()`` yields the base URL) or on a
unix socket (``fake.serve_unix(path)``), e.g. as the model gateway's
upstream.

A scripted reply is a ``(status, body, extra headers)`` tuple, where body is
a JSON value (sent encoded) or ``bytes`` (sent as they are: malformed
bodies), or a callable that gets the :class:`Recorded` request and returns
one.  Helpers: :func:`chat` (a completion), :func:`chat_stream` (a streamed
one), :func:`tool_call`, :func:`api_error` (OpenAI's error shape),
:func:`raw`.  Any other route gets a 404; an exhausted script a 500.  A
request that asks for ``"stream": true`` gets a scripted whole completion
as a streaming server sends it (:func:`chunk_events`), paced by
:func:`paced` when the script says so.
"""

from __future__ import annotations

import base64
import json
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, Union

from fakes.anthropic_api import Recorded, UnixHTTPServer, serving

__all__ = [
    "CHAT_PATH",
    "FakeOpenAI",
    "Recorded",
    "api_error",
    "chat",
    "chat_stream",
    "chunk_events",
    "paced",
    "raw",
    "tool_call",
]

Body = Union[dict[str, Any], list[Any], bytes]
Reply = tuple[int, Body, dict[str, str]]
Script = Union[Reply, Callable[[Recorded], Reply]]

CHAT_PATH = "/v1/chat/completions"


def tool_call(call_id: str, name: str, arguments: dict[str, Any] | str) -> dict[str, Any]:
    """One entry of ``message.tool_calls``; a dict is JSON-encoded, a str sent as is."""
    args = arguments if isinstance(arguments, str) else json.dumps(arguments)
    return {"id": call_id, "type": "function", "function": {"name": name, "arguments": args}}


def chat(
    content: str | None = None,
    tool_calls: list[dict[str, Any]] | None = None,
    finish_reason: str | None = None,
    n: int = 1,
    **message_extra: Any,
) -> Reply:
    """A 200 completion; usage is ``10*n`` prompt and ``n`` completion tokens.

    ``finish_reason`` defaults to ``tool_calls`` when there are tool calls,
    else ``stop``.
    """
    message: dict[str, Any] = {"role": "assistant", "content": content, **message_extra}
    if tool_calls:
        message["tool_calls"] = tool_calls
    body = {
        "id": f"chatcmpl-fake-{n}",
        "object": "chat.completion",
        "created": int(time.time()),
        "model": "fake-model",
        "system_fingerprint": "fp_fake",
        "choices": [
            {
                "index": 0,
                "message": message,
                "logprobs": None,
                "finish_reason": finish_reason or ("tool_calls" if tool_calls else "stop"),
            }
        ],
        "usage": {"prompt_tokens": 10 * n, "completion_tokens": n, "total_tokens": 11 * n},
    }
    return 200, body, {}


def chat_stream(content: str, n: int = 1, *, cached: int = 0) -> Callable[[Recorded], Reply]:
    """A 200 streamed completion (``"stream": true``), as the API sends it: ``data:`` chunks, then ``[DONE]``.

    Like the real API, the usage chunk (``10*n`` prompt tokens, ``cached`` of
    them from the prompt cache, and ``n`` completion tokens) comes last and
    only when the request asked for it with ``stream_options.include_usage``;
    every chunk then carries ``"usage": null`` before it.
    """

    def reply(rec: Recorded) -> Reply:
        options = (rec.body or {}).get("stream_options") or {}
        with_usage = options.get("include_usage") is True
        base = {
            "id": f"chatcmpl-fake-{n}",
            "object": "chat.completion.chunk",
            "created": int(time.time()),
            "model": "fake-model",
            "system_fingerprint": "fp_fake",
        }
        null_usage = {"usage": None} if with_usage else {}
        deltas = [{"role": "assistant", "content": ""}, *({"content": word} for word in content.split(" "))]
        chunks = [
            {**base, "choices": [{"index": 0, "delta": d, "logprobs": None, "finish_reason": None}], **null_usage}
            for d in deltas
        ]
        chunks.append(
            {**base, "choices": [{"index": 0, "delta": {}, "logprobs": None, "finish_reason": "stop"}], **null_usage}
        )
        if with_usage:
            chunks.append(
                {
                    **base,
                    "choices": [],
                    "usage": {
                        "prompt_tokens": 10 * n,
                        "completion_tokens": n,
                        "total_tokens": 11 * n,
                        "prompt_tokens_details": {"cached_tokens": cached},
                    },
                }
            )
        data = b"".join(b"data: " + json.dumps(c).encode() + b"\n\n" for c in chunks) + b"data: [DONE]\n\n"
        return raw(200, data, "text/event-stream")

    return reply


def chunk_events(body: dict[str, Any], with_usage: bool) -> list[dict[str, Any]]:
    """The ``chat.completion.chunk`` objects a streaming server sends for the whole completion ``body``.

    A first chunk with the role, reasoning then text a word at a time, each
    tool call as fragments (its id and name first, the arguments in pieces,
    by ``index``), a chunk with the finish reason, and (``with_usage``, as
    ``stream_options.include_usage`` asks) a last chunk with the usage and
    no choices; every chunk before it then has ``"usage": null``.
    """
    base = {k: body[k] for k in ("id", "created", "model", "system_fingerprint")}
    base["object"] = "chat.completion.chunk"
    null_usage = {"usage": None} if with_usage else {}
    choice = body["choices"][0]
    message = choice["message"]
    deltas: list[dict[str, Any]] = [{"role": "assistant", "content": ""}]
    for key in ("reasoning_content", "reasoning"):
        if isinstance(message.get(key), str):
            deltas.append({key: message[key]})
    if isinstance(message.get("content"), str) and message["content"]:
        words = message["content"].split(" ")
        deltas += [{"content": w if i == 0 else " " + w} for i, w in enumerate(words)]
    for index, call in enumerate(message.get("tool_calls") or []):
        deltas.append(
            {
                "tool_calls": [
                    {
                        "index": index,
                        "id": call["id"],
                        "type": "function",
                        "function": {"name": call["function"]["name"], "arguments": ""},
                    }
                ]
            }
        )
        args = call["function"]["arguments"]
        deltas += [
            {"tool_calls": [{"index": index, "function": {"arguments": args[i : i + 7]}}]}
            for i in range(0, len(args), 7)
        ]
    chunks = [
        {**base, "choices": [{"index": 0, "delta": d, "logprobs": None, "finish_reason": None}], **null_usage}
        for d in deltas
    ]
    chunks.append(
        {
            **base,
            "choices": [{"index": 0, "delta": {}, "logprobs": None, "finish_reason": choice["finish_reason"]}],
            **null_usage,
        }
    )
    if with_usage:
        chunks.append({**base, "choices": [], "usage": body["usage"]})
    return chunks


# Knobs a scripted reply carries in its extra headers (never sent): the pause
# before the first chunk of a streamed answer and between its chunks, in seconds.
FIRST_DELAY = "x-fake-first-delay"
CHUNK_DELAY = "x-fake-chunk-delay"


def paced(reply: Reply, chunk_delay_s: float, first_delay_s: float = 0.0) -> Reply:
    """``reply`` streamed (when the request asks ``"stream": true``) with these pauses."""
    status, body, extra = reply
    return status, body, {**extra, CHUNK_DELAY: str(chunk_delay_s), FIRST_DELAY: str(first_delay_s)}


def _paced(chunks: list[dict[str, Any]], first_delay_s: float, chunk_delay_s: float) -> Iterator[bytes]:
    time.sleep(first_delay_s)
    for i, chunk in enumerate(chunks):
        if i and chunk_delay_s:
            time.sleep(chunk_delay_s)
        yield b"data: " + json.dumps(chunk).encode() + b"\n\n"
    yield b"data: [DONE]\n\n"


_PART_TYPES = ("text", "image_url", "input_audio", "file")


def image_problem(body: Any) -> str | None:
    """What Chat Completions would refuse in ``body``'s content parts, as OpenAI documents
    them: a user message's ``content`` may be a list of parts (``text``, ``image_url``,
    ``input_audio``, ``file``); an ``image_url``'s ``url`` is an http(s) URL or a
    ``data:image/...;base64,...`` one (None: nothing wrong)."""
    for i, message in enumerate((body or {}).get("messages") or [] if isinstance(body, dict) else []):
        content = message.get("content")
        if not isinstance(content, list):
            continue
        if message.get("role") not in ("user", "system"):
            return f"messages[{i}].content: parts are not accepted in a {message.get('role')} message here"
        for j, part in enumerate(content):
            kind = part.get("type") if isinstance(part, dict) else None
            if kind not in _PART_TYPES:
                return f"messages[{i}].content[{j}]: unknown part type {kind!r}"
            if kind != "image_url":
                continue
            url = part.get("image_url", {}).get("url")
            if not isinstance(url, str):
                return f"messages[{i}].content[{j}].image_url.url: expected a string"
            head, comma, data = url.strip().partition(",")
            if head.lower().startswith(("http://", "https://")):
                continue
            if not (head.lower().startswith("data:image/") and head.lower().endswith(";base64") and comma):
                return f"messages[{i}].content[{j}].image_url.url: expected an http(s) or data:image/...;base64 URL"
            try:
                base64.b64decode(data, validate=True)
            except (ValueError, TypeError):
                return f"messages[{i}].content[{j}].image_url.url: not base64"
    return None


def api_error(
    status: int, message: str, kind: str = "invalid_request_error", headers: dict[str, str] | None = None
) -> Reply:
    """OpenAI's error response ``{"error": {"message", "type", "param", "code"}}``."""
    return status, {"error": {"message": message, "type": kind, "param": None, "code": None}}, dict(headers or {})


def raw(status: int, body: bytes | str, content_type: str = "application/json") -> Reply:
    """A reply whose body is sent byte for byte (malformed JSON, HTML, ...)."""
    data = body.encode() if isinstance(body, str) else body
    return status, data, {"content-type": content_type}


class FakeOpenAI:
    """Scripted POST /v1/chat/completions; remembers every request it got.

    ``requests`` are the JSON bodies and ``headers`` the (lower-cased)
    headers of every request, in arrival order; ``calls`` has the full
    records, ``times`` their arrival (``time.monotonic()``) and ``sent`` the
    replies given, in the same order.
    """

    def __init__(self, *replies: Script, on_request: Callable[[Recorded], None] | None = None) -> None:
        self.replies: list[Script] = list(replies)
        self.on_request = on_request
        self.calls: list[Recorded] = []
        self.times: list[float] = []
        self.sent: list[Reply] = []
        self._lock = threading.Lock()

    @property
    def requests(self) -> list[Any]:
        with self._lock:
            return [c.body for c in self.calls]

    @property
    def headers(self) -> list[dict[str, str]]:
        with self._lock:
            return [c.headers for c in self.calls]

    def usage(self) -> tuple[int, int]:
        """Prompt and completion tokens of all successful JSON replies sent so far."""
        with self._lock:
            bodies = [b for status, b, _ in self.sent if status == 200 and isinstance(b, dict) and "usage" in b]
        return (
            sum(b["usage"]["prompt_tokens"] for b in bodies),
            sum(b["usage"]["completion_tokens"] for b in bodies),
        )

    def _record(self, h: BaseHTTPRequestHandler) -> Recorded:
        length = int(h.headers.get("Content-Length") or 0)
        data = h.rfile.read(length) if length else b""
        try:
            body = json.loads(data) if data else None
        except ValueError:
            body = None
        rec = Recorded(
            method=h.command,
            path=h.path,
            headers={k.lower(): v for k, v in h.headers.items()},
            body=body,
            raw=data,
        )
        with self._lock:
            self.calls.append(rec)
            self.times.append(time.monotonic())
        return rec

    def _next_reply(self, rec: Recorded) -> Reply:
        if rec.method != "POST" or rec.path.split("?")[0] != CHAT_PATH:
            return api_error(404, f"no route {rec.method} {rec.path}", "not_found")
        wrong = image_problem(rec.body)
        if wrong is not None:
            return api_error(400, wrong)
        with self._lock:
            script = self.replies.pop(0) if self.replies else None
        if script is None:
            return api_error(500, "script exhausted", "server_error")
        return script(rec) if callable(script) else script

    def handler(self) -> type[BaseHTTPRequestHandler]:
        fake = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def _serve_one(self) -> None:
                rec = fake._record(self)
                if fake.on_request is not None:
                    fake.on_request(rec)
                status, body, extra = fake._next_reply(rec)
                with fake._lock:
                    fake.sent.append((status, body, extra))
                headers = {"content-type": "application/json", **{k.lower(): v for k, v in extra.items()}}
                first_delay = float(headers.pop(FIRST_DELAY, 0))
                chunk_delay = float(headers.pop(CHUNK_DELAY, 0))
                request = rec.body if isinstance(rec.body, dict) else {}
                if (
                    request.get("stream") is True
                    and status == 200
                    and isinstance(body, dict)
                    and body.get("object") == "chat.completion"
                    and body.get("choices")
                ):
                    # A whole completion scripted, a stream asked for: sent as a streaming server would.
                    with_usage = (request.get("stream_options") or {}).get("include_usage") is True
                    self.send_response(status)
                    self.send_header("content-type", "text/event-stream")
                    self.send_header("transfer-encoding", "chunked")
                    self.end_headers()
                    for piece in _paced(chunk_events(body, with_usage), first_delay, chunk_delay):
                        self.wfile.write(b"%x\r\n%s\r\n" % (len(piece), piece))
                        self.wfile.flush()
                    self.wfile.write(b"0\r\n\r\n")
                    return
                data = body if isinstance(body, bytes) else json.dumps(body).encode()
                self.send_response(status)
                for key, value in headers.items():
                    self.send_header(key, value)
                self.send_header("content-length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            do_POST = do_GET = do_PUT = do_DELETE = do_PATCH = _serve_one  # noqa: N815

            def address_string(self) -> str:  # client_address is '' on unix sockets
                return str(self.client_address[0]) if self.client_address else "unix"

            def log_message(self, format: str, *args: Any) -> None:
                pass

        return Handler

    @contextmanager
    def serve(self) -> Iterator[str]:
        """Serve on 127.0.0.1 (a free port); yields the base URL (the server's root)."""
        server = ThreadingHTTPServer(("127.0.0.1", 0), self.handler())
        server.daemon_threads = True
        with serving(server):
            yield f"http://127.0.0.1:{server.server_address[1]}"

    @contextmanager
    def serve_unix(self, path: str) -> Iterator[str]:
        """Serve on the unix socket ``path`` (keep it short: ~100 bytes at most)."""
        with serving(UnixHTTPServer(path, self.handler())):
            yield path
