"""A fake Anthropic Messages API speaking the real wire format.

``FakeAnthropic`` plays a script of replies to ``POST /v1/messages`` and
records every request it gets (method, path, headers, parsed JSON body).  It
is thread-safe and can be served on loopback TCP (``fake.serve()`` yields the
base URL of a server on 127.0.0.1, port 0) or on a unix socket
(``fake.serve_unix(path)``), e.g. as the upstream of the model gateway while a
worker process and a container talk to it.

A scripted reply is a ``(status, body, extra headers)`` tuple (see
:func:`message`, :func:`message_stream` and :func:`api_error`) or a callable
that gets the :class:`Recorded` request and returns one.  A body is a JSON
value, ``bytes`` (sent as they are) or an iterator of ``bytes`` (each chunk
sent and flushed as it comes, the end of the body is the end of the
connection: how a streamed answer arrives).  A request that asks for
``"stream": true`` gets a scripted whole message as the streaming API sends
it (:func:`message_events`), paced by :func:`paced` when the script says so.  ``on_request`` is called with
each recorded request, in the server's thread, before the reply is sent.
"""

from __future__ import annotations

import base64
import hashlib
import json
import socketserver
import threading
import time
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, Union

import pytest

Reply = tuple[int, Any, dict[str, str]]
Script = Union[Reply, Callable[["Recorded"], Reply]]

MESSAGES_PATH = "/v1/messages"


def _usage(n: int, cache_creation: int, cache_read: int) -> dict[str, int]:
    usage = {"input_tokens": 10 * n, "output_tokens": n}
    if cache_creation or cache_read:
        usage.update(cache_creation_input_tokens=cache_creation, cache_read_input_tokens=cache_read)
    return usage


def message(
    content: list[dict[str, Any]], stop_reason: str, n: int = 1, *, cache_creation: int = 0, cache_read: int = 0
) -> Reply:
    """A 200 Messages API response; usage is ``10*n`` input and ``n`` output tokens.

    ``cache_creation``/``cache_read``: prompt-cache tokens, which the API
    reports apart from ``input_tokens``.
    """
    body = {
        "id": f"msg_fake_{n}",
        "type": "message",
        "role": "assistant",
        "model": "claude-fake",
        "content": content,
        "stop_reason": stop_reason,
        "stop_sequence": None,
        "usage": _usage(n, cache_creation, cache_read),
    }
    return 200, body, {}


def sse(events: Iterable[dict[str, Any]]) -> bytes:
    """Server-sent events as the API frames them: ``event: <type>`` and one ``data:`` JSON line each."""
    return b"".join(f"event: {e['type']}\ndata: {json.dumps(e)}\n\n".encode() for e in events)


def message_stream(
    text: str,
    n: int = 1,
    *,
    cache_creation: int = 0,
    cache_read: int = 0,
    hold: threading.Event | None = None,
) -> Reply:
    """A 200 streamed (``"stream": true``) text answer, as the Messages API sends it.

    ``message_start`` carries the input and cache counts (and a first output
    count of 1), ``message_delta`` the final output count ``n``.  With
    ``hold``, the stream stops after ``message_start`` until ``hold`` is set
    (at most 10 s): a client can show that it got the start before the rest
    was sent.
    """
    start: dict[str, Any] = {
        "type": "message_start",
        "message": {
            "id": f"msg_fake_{n}",
            "type": "message",
            "role": "assistant",
            "model": "claude-fake",
            "content": [],
            "stop_reason": None,
            "stop_sequence": None,
            "usage": {**_usage(n, cache_creation, cache_read), "output_tokens": 1},
        },
    }
    rest: list[dict[str, Any]] = [
        {"type": "content_block_start", "index": 0, "content_block": {"type": "text", "text": ""}},
        {"type": "ping"},
        *(
            {"type": "content_block_delta", "index": 0, "delta": {"type": "text_delta", "text": word}}
            for word in text.split(" ")
        ),
        {"type": "content_block_stop", "index": 0},
        {
            "type": "message_delta",
            "delta": {"stop_reason": "end_turn", "stop_sequence": None},
            "usage": {"output_tokens": n},
        },
        {"type": "message_stop"},
    ]

    def chunks() -> Iterator[bytes]:
        yield sse([start])
        if hold is not None:
            hold.wait(10)
        yield from (sse([event]) for event in rest)

    return 200, chunks(), {"content-type": "text/event-stream"}


# Knobs a scripted reply carries in its extra headers (never sent): the pause
# before the first event of a streamed answer and between its events, in seconds.
FIRST_DELAY = "x-fake-first-delay"
CHUNK_DELAY = "x-fake-chunk-delay"


def paced(reply: Reply, chunk_delay_s: float, first_delay_s: float = 0.0) -> Reply:
    """``reply`` streamed (when the request asks ``"stream": true``) with these pauses."""
    status, body, extra = reply
    return status, body, {**extra, CHUNK_DELAY: str(chunk_delay_s), FIRST_DELAY: str(first_delay_s)}


def message_events(body: dict[str, Any]) -> list[dict[str, Any]]:
    """The events the streaming Messages API sends for the whole message ``body``.

    ``message_start`` with the input and cache counts (output 1), each block
    as ``content_block_start`` / deltas / ``content_block_stop`` (text a word
    at a time as ``text_delta``, thinking as ``thinking_delta`` then a
    ``signature_delta``, a tool's input as ``input_json_delta`` pieces, a
    redacted block whole in its start), a ``ping``, ``message_delta`` with
    the stop reason and the final output count, ``message_stop``.
    """
    usage = dict(body["usage"])
    events: list[dict[str, Any]] = [
        {
            "type": "message_start",
            "message": {
                **{k: v for k, v in body.items() if k not in ("content", "stop_reason", "usage")},
                "content": [],
                "stop_reason": None,
                "stop_sequence": None,
                "usage": {**usage, "output_tokens": 1},
            },
        },
        {"type": "ping"},
    ]
    for index, block in enumerate(body["content"]):
        kind = block["type"]
        deltas: list[dict[str, Any]] = []
        if kind == "text":
            start: dict[str, Any] = {"type": "text", "text": ""}
            words = block["text"].split(" ")
            deltas = [{"type": "text_delta", "text": w if i == 0 else " " + w} for i, w in enumerate(words)]
        elif kind == "thinking":
            start = {"type": "thinking", "thinking": ""}
            deltas = [{"type": "thinking_delta", "thinking": block["thinking"]}]
            if block.get("signature"):
                deltas.append({"type": "signature_delta", "signature": block["signature"]})
        elif kind == "tool_use":
            start = {"type": "tool_use", "id": block["id"], "name": block["name"], "input": {}}
            raw = json.dumps(block["input"])
            deltas = [{"type": "input_json_delta", "partial_json": raw[i : i + 7]} for i in range(0, len(raw), 7)]
        else:  # redacted_thinking and anything else: whole in its start
            start = block
        events.append({"type": "content_block_start", "index": index, "content_block": start})
        events += [{"type": "content_block_delta", "index": index, "delta": d} for d in deltas]
        events.append({"type": "content_block_stop", "index": index})
    events.append(
        {
            "type": "message_delta",
            "delta": {"stop_reason": body["stop_reason"], "stop_sequence": None},
            "usage": {"output_tokens": usage["output_tokens"]},
        }
    )
    events.append({"type": "message_stop"})
    return events


def _paced(events: list[dict[str, Any]], first_delay_s: float, chunk_delay_s: float) -> Iterator[bytes]:
    time.sleep(first_delay_s)
    for i, event in enumerate(events):
        if i and chunk_delay_s:
            time.sleep(chunk_delay_s)
        yield sse([event])


IMAGE_TYPES = ("image/jpeg", "image/png", "image/gif", "image/webp")


def image_problem(body: Any) -> str | None:
    """What the Messages API would refuse in ``body``'s image blocks, as it documents them:
    ``{"type": "image", "source": {"type": "base64", "media_type": one of IMAGE_TYPES,
    "data": base64}}``, in user turns only (None: nothing wrong)."""
    for i, message in enumerate((body or {}).get("messages") or [] if isinstance(body, dict) else []):
        content = message.get("content")
        for j, block in enumerate(content if isinstance(content, list) else []):
            if not isinstance(block, dict) or block.get("type") != "image":
                continue
            where = f"messages.{i}.content.{j}"
            if message.get("role") != "user":
                return f"{where}: image blocks are allowed in user messages only"
            source = block.get("source")
            if not isinstance(source, dict) or set(source) != {"type", "media_type", "data"}:
                return f"{where}.source: expected type, media_type and data"
            if source["type"] != "base64" or source["media_type"] not in IMAGE_TYPES:
                return f"{where}.source: unsupported image source {source['type']!r} {source['media_type']!r}"
            try:
                base64.b64decode(source["data"], validate=True)
            except (ValueError, TypeError):
                return f"{where}.source.data: not base64"
    return None


def api_error(status: int, kind: str, text: str, headers: dict[str, str] | None = None) -> Reply:
    """An API error response ``{"type": "error", "error": {"type": kind, "message": text}}``."""
    # retry-after-ms keeps the SDK's retry backoff short in tests.
    return (
        status,
        {"type": "error", "error": {"type": kind, "message": text}},
        {"retry-after-ms": "10", **(headers or {})},
    )


@dataclass(frozen=True)
class Recorded:
    """One request the fake received."""

    method: str
    path: str
    headers: dict[str, str]  # names lower-cased
    body: Any  # the parsed JSON body, or None if it was empty or not JSON
    raw: bytes


class PromptCache:
    """Anthropic's prompt cache, as the API counts it (for a fake, by hash).

    A request's prompt is its tools, then its system blocks, then its
    messages' content blocks, in that order.  Blocks marked with
    ``cache_control`` are breakpoints: the prefix ending at each one is
    written (``cache_creation_input_tokens``) unless it is shorter than
    ``min_tokens`` (the API's minimum cacheable prompt: 1024 tokens for most
    models); a later request reads back (``cache_read_input_tokens``) the
    longest prefix it shares with one written, found at a breakpoint or at
    most 20 blocks before one, as the API looks.  Tokens are the blocks'
    JSON bytes / 4; ``input_tokens`` is what is neither read nor written.
    """

    LOOKBACK = 20

    def __init__(self, min_tokens: int = 1024) -> None:
        self.min_tokens = min_tokens
        self._written: set[str] = set()
        self._lock = threading.Lock()

    @staticmethod
    def _blocks(body: dict[str, Any]) -> list[tuple[dict[str, Any], bool]]:
        """Each block of the prompt, cache_control taken off, and whether it is a breakpoint."""
        out: list[tuple[dict[str, Any], bool]] = []

        def add(where: dict[str, Any], block: Any) -> None:
            if isinstance(block, dict):
                mark = "cache_control" in block
                block = {k: v for k, v in block.items() if k != "cache_control"}
            else:
                mark = False
            out.append(({**where, "block": block}, mark))

        for tool in body.get("tools") or []:
            add({"in": "tools"}, tool)
        system = body.get("system")
        for block in [system] if isinstance(system, str) else system or []:
            add({"in": "system"}, block)
        for i, message in enumerate(body.get("messages") or []):
            content = message.get("content")
            for block in [{"type": "text", "text": content}] if isinstance(content, str) else content or []:
                add({"in": i, "role": message.get("role")}, block)
        return out

    def usage(self, body: Any) -> dict[str, int]:
        """``input_tokens``, ``cache_creation_input_tokens`` and ``cache_read_input_tokens`` of ``body``."""
        blocks = self._blocks(body if isinstance(body, dict) else {})
        sizes, prefixes, marks = [], [], []
        digest = hashlib.sha256()
        for block, mark in blocks:
            data = json.dumps(block, sort_keys=True).encode()
            sizes.append((len(data) + 3) // 4)
            digest.update(data)
            prefixes.append(digest.copy().hexdigest())
            marks.append(mark)
        total = sum(sizes)
        upto = [sum(sizes[: i + 1]) for i in range(len(sizes))]
        points = [i for i, mark in enumerate(marks) if mark]
        with self._lock:
            hits = [
                j for b in points for j in range(b, max(-1, b - self.LOOKBACK - 1), -1) if prefixes[j] in self._written
            ]
            read = upto[max(hits)] if hits else 0
            written = [b for b in points if upto[b] >= self.min_tokens and upto[b] > read]
            self._written.update(prefixes[b] for b in written)
        creation = upto[max(written)] - read if written else 0
        return {
            "input_tokens": total - read - creation,
            "cache_creation_input_tokens": creation,
            "cache_read_input_tokens": read,
        }


class FakeAnthropic:
    """Scripted POST /v1/messages; remembers every request it got.

    With ``prompt_cache`` (a :class:`PromptCache`), a scripted 200 message's
    input counts are replaced by what the cache counts for the request.

    ``requests`` are the JSON bodies and ``headers`` the (lower-cased) headers
    of every request, in arrival order; ``calls`` has the full records and
    ``sent`` the replies given, in the same order.
    """

    def __init__(
        self,
        *replies: Script,
        on_request: Callable[[Recorded], None] | None = None,
        prompt_cache: PromptCache | None = None,
    ) -> None:
        self.replies: list[Script] = list(replies)
        self.on_request = on_request
        self.prompt_cache = prompt_cache
        self.calls: list[Recorded] = []
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

    @property
    def paths(self) -> list[str]:
        with self._lock:
            return [c.path for c in self.calls]

    def _record(self, h: BaseHTTPRequestHandler) -> Recorded:
        length = int(h.headers.get("Content-Length") or 0)
        raw = h.rfile.read(length) if length else b""
        try:
            body = json.loads(raw) if raw else None
        except ValueError:
            body = None
        rec = Recorded(
            method=h.command,
            path=h.path,
            headers={k.lower(): v for k, v in h.headers.items()},
            body=body,
            raw=raw,
        )
        with self._lock:
            self.calls.append(rec)
        return rec

    def _next_reply(self, rec: Recorded) -> Reply:
        if rec.method != "POST" or rec.path.split("?")[0] != MESSAGES_PATH:
            return 404, {"type": "error", "error": {"type": "not_found_error", "message": rec.path}}, {}
        wrong = image_problem(rec.body)
        if wrong is not None:
            return api_error(400, "invalid_request_error", wrong)
        with self._lock:
            script = self.replies.pop(0) if self.replies else None
        if script is None:
            return 500, {"type": "error", "error": {"type": "api_error", "message": "script exhausted"}}, {}
        return script(rec) if callable(script) else script

    def usage(self) -> tuple[int, int]:
        """Input and output tokens of all successful replies sent so far."""
        with self._lock:
            bodies = [body for status, body, _ in self.sent if status == 200 and isinstance(body, dict)]
        return (
            sum(b["usage"]["input_tokens"] for b in bodies),
            sum(b["usage"]["output_tokens"] for b in bodies),
        )

    def handler(self) -> type[BaseHTTPRequestHandler]:
        fake = self

        class Handler(BaseHTTPRequestHandler):
            def _serve_one(self) -> None:
                rec = fake._record(self)
                if fake.on_request is not None:
                    fake.on_request(rec)
                status, body, extra = fake._next_reply(rec)
                if fake.prompt_cache is not None and status == 200 and isinstance(body, dict) and "usage" in body:
                    body = {**body, "usage": {**body["usage"], **fake.prompt_cache.usage(rec.body)}}
                with fake._lock:
                    fake.sent.append((status, body, extra))
                extra = {k.lower(): v for k, v in extra.items()}
                first_delay = float(extra.pop(FIRST_DELAY, 0))
                chunk_delay = float(extra.pop(CHUNK_DELAY, 0))
                streamed = isinstance(rec.body, dict) and rec.body.get("stream") is True
                if streamed and status == 200 and isinstance(body, dict) and body.get("type") == "message":
                    # A whole message scripted, a stream asked for: sent as the streaming API would.
                    body = _paced(message_events(body), first_delay, chunk_delay)
                    extra["content-type"] = "text/event-stream"
                self.send_response(status)
                self.send_header("Content-Type", extra.pop("content-type", "application/json"))
                for key, value in extra.items():
                    self.send_header(key, value)
                if isinstance(body, Iterator):  # streamed: each chunk as it comes, until the connection ends
                    self.end_headers()
                    for chunk in body:
                        self.wfile.write(chunk)
                        self.wfile.flush()
                    self.close_connection = True
                    return
                # bytes: sent as they are (a malformed response on purpose)
                data = body if isinstance(body, bytes) else json.dumps(body).encode()
                self.send_header("Content-Length", str(len(data)))
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
        """Serve on 127.0.0.1 (a free port); yields the base URL."""
        server = ThreadingHTTPServer(("127.0.0.1", 0), self.handler())
        server.daemon_threads = True
        with serving(server):
            yield f"http://127.0.0.1:{server.server_address[1]}"

    @contextmanager
    def serve_unix(self, path: str) -> Iterator[str]:
        """Serve on the unix socket ``path`` (keep it short: ~100 bytes at most)."""
        with serving(UnixHTTPServer(path, self.handler())):
            yield path


class UnixHTTPServer(socketserver.ThreadingMixIn, socketserver.UnixStreamServer):
    daemon_threads = True


def _serve(server: socketserver.BaseServer) -> Iterator[None]:
    """Run ``server`` in a daemon thread until the generator is resumed."""
    thread = threading.Thread(target=server.serve_forever, args=(0.05,), daemon=True, name="fake-model-api")
    thread.start()
    try:
        yield
    finally:
        server.shutdown()
        server.server_close()
        thread.join()


serving = contextmanager(_serve)


@pytest.fixture
def serve_tcp() -> Iterator[Callable[[FakeAnthropic], str]]:
    """serve_tcp(fake) -> base_url of a loopback server playing ``fake``."""
    servers: list[Iterator[None]] = []

    def start(fake: FakeAnthropic) -> str:
        server = ThreadingHTTPServer(("127.0.0.1", 0), fake.handler())
        server.daemon_threads = True
        running = _serve(server)
        next(running)
        servers.append(running)
        return f"http://127.0.0.1:{server.server_address[1]}"

    yield start
    for running in servers:
        next(running, None)


def sent_key(headers: dict[str, str]) -> str | None:
    """The API key a request carried: SDK versions use x-api-key or a bearer token."""
    if "x-api-key" in headers:
        return headers["x-api-key"]
    auth = headers.get("authorization", "")
    return auth.removeprefix("Bearer ") if auth.startswith("Bearer ") else None
