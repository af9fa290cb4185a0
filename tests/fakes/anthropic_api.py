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
connection: how a streamed answer arrives).  ``on_request`` is called with
each recorded request, in the server's thread, before the reply is sent.
"""

from __future__ import annotations

import json
import socketserver
import threading
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
    text: str, n: int = 1, *, cache_creation: int = 0, cache_read: int = 0,
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
            "id": f"msg_fake_{n}", "type": "message", "role": "assistant", "model": "claude-fake",
            "content": [], "stop_reason": None, "stop_sequence": None,
            "usage": {**_usage(n, cache_creation, cache_read), "output_tokens": 1},
        },
    }
    rest: list[dict[str, Any]] = [
        {"type": "content_block_start", "index": 0, "content_block": {"type": "text", "text": ""}},
        {"type": "ping"},
        *({"type": "content_block_delta", "index": 0, "delta": {"type": "text_delta", "text": word}}
          for word in text.split(" ")),
        {"type": "content_block_stop", "index": 0},
        {"type": "message_delta", "delta": {"stop_reason": "end_turn", "stop_sequence": None},
         "usage": {"output_tokens": n}},
        {"type": "message_stop"},
    ]

    def chunks() -> Iterator[bytes]:
        yield sse([start])
        if hold is not None:
            hold.wait(10)
        yield from (sse([event]) for event in rest)

    return 200, chunks(), {"content-type": "text/event-stream"}


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


class FakeAnthropic:
    """Scripted POST /v1/messages; remembers every request it got.

    ``requests`` are the JSON bodies and ``headers`` the (lower-cased) headers
    of every request, in arrival order; ``calls`` has the full records and
    ``sent`` the replies given, in the same order.
    """

    def __init__(self, *replies: Script, on_request: Callable[[Recorded], None] | None = None) -> None:
        self.replies: list[Script] = list(replies)
        self.on_request = on_request
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
                with fake._lock:
                    fake.sent.append((status, body, extra))
                extra = {k.lower(): v for k, v in extra.items()}
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
    thread = threading.Thread(target=server.serve_forever, args=(0.05,), daemon=True)
    thread.start()
    try:
        yield
    finally:
        server.shutdown()
        server.server_close()


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
