"""A fake Slack on loopback, speaking the real wire formats: the Web API and Socket Mode.

**Web API**: ``POST /api/<method>`` with ``Authorization: Bearer <token>`` and
JSON (what slack_sdk's ``api_call(json=...)`` sends) or a form (what its
generated methods send), answering ``{"ok": true, ...}`` or ``{"ok": false,
"error": "..."}`` as Slack does (a wrong token: ``invalid_auth``).  Methods:
``auth.test``, ``users.info``, ``chat.postMessage`` (refuses more than 50 blocks
and a section text over 3,000 characters, ``msg_too_long``/``invalid_blocks``
as the real one), ``chat.update``, ``chat.delete``, ``chat.postEphemeral``,
and ``apps.connections.open`` (the app-level token only), which answers the
``ws://127.0.0.1:<port>/link/?ticket=...`` of the fake Socket Mode server.

Tests script it: :meth:`FakeSlack.fail` makes the next calls of a method fail
(HTTP 429 with ``Retry-After`` and ``{"ok": false, "error": "ratelimited"}``,
or a 500, or any error answer); every request is kept in ``requests``.

**Socket Mode**: a websocket server (the ``websockets`` library) that sends
``{"type": "hello", ...}`` to each connection, then the ``events_api``
envelopes :meth:`FakeSlack.push_event` queues (``envelope_id``, ``payload``:
the ``event_callback`` document, ``retry_attempt``), and records each
``{"envelope_id": ...}`` acknowledgement.  An envelope not acknowledged is sent
again, ``retry_attempt`` + 1, to the next connection (:meth:`redeliver`, or on
connect), as Slack does.
"""

from __future__ import annotations

import json
import threading
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import parse_qsl, urlsplit

import pytest
from websockets.exceptions import ConnectionClosed
from websockets.sync.server import Server, ServerConnection, serve

SECTION_LIMIT = 3000
BLOCKS_LIMIT = 50


@dataclass
class Request:
    method: str  # chat.postMessage, auth.test, ...
    params: dict[str, Any]
    token: str
    status: int = 200
    error: str | None = None


@dataclass
class _Failure:
    status: int
    error: str
    retry_after: int | None
    raw: str | None  # a body that is not JSON (a load balancer's 500 page)


@dataclass
class Post:
    channel: str
    ts: str
    text: str
    blocks: list[dict[str, Any]]
    thread_ts: str | None
    deleted: bool = False
    updates: int = 0


@dataclass
class FakeSlack:
    bot_token: str = "xoxb-fake-bot-token"
    app_token: str = "xapp-fake-app-token"
    bot_user: str = "UBOT0001"
    team: str = "T0000001"
    requests: list[Request] = field(default_factory=list)
    posts: list[Post] = field(default_factory=list)
    users: dict[str, str] = field(default_factory=lambda: {"UANN0001": "Ann Lee", "UBOB0002": "Bob"})

    def __post_init__(self) -> None:
        self._lock = threading.Condition()
        self._failures: dict[str, list[_Failure | None]] = {}
        self._ts = int(time.time()) * 1_000_000
        self.server = ThreadingHTTPServer(("127.0.0.1", 0), self._handler())
        self.server.daemon_threads = True
        self.base = f"http://127.0.0.1:{self.server.server_address[1]}/api/"
        # Socket Mode
        self.acks: list[str] = []
        self.hellos = 0
        self.connections: list[ServerConnection] = []
        self._pending: dict[str, dict[str, Any]] = {}  # sent, not acknowledged
        self._envelopes: dict[str, dict[str, Any]] = {}  # every envelope, by id
        self._queue: list[dict[str, Any]] = []  # not sent yet (no connection)
        self.ws: Server = serve(self._socket, "127.0.0.1", 0)
        self.ws_url = f"ws://127.0.0.1:{self.ws.socket.getsockname()[1]}/link/"

    # -- scripting ---------------------------------------------------------------

    def fail(
        self,
        method: str,
        status: int = 500,
        *,
        times: int = 1,
        after: int = 0,
        retry_after: int = 1,
        error: str | None = None,
        raw: str | None = None,
    ) -> None:
        """The next ``times`` calls of ``method`` (after ``after`` good ones) fail with ``status``."""
        err = error or {429: "ratelimited", 500: "internal_error"}.get(status, "fatal_error")
        with self._lock:
            script = self._failures.setdefault(method, [])
            script.extend([None] * after)
            script.extend(_Failure(status, err, retry_after if status == 429 else None, raw) for _ in range(times))

    def calls(self, method: str, *, ok_only: bool = False) -> list[Request]:
        with self._lock:
            return [r for r in self.requests if r.method == method and (r.error is None or not ok_only)]

    def live_posts(self, channel: str | None = None) -> list[Post]:
        with self._lock:
            return [p for p in self.posts if not p.deleted and (channel is None or p.channel == channel)]

    def next_ts(self) -> str:
        with self._lock:
            self._ts += 100
            return f"{self._ts // 1_000_000}.{self._ts % 1_000_000:06d}"

    def message_event(
        self,
        channel: str,
        user: str | None,
        text: str,
        *,
        ts: str | None = None,
        thread_ts: str | None = None,
        event_type: str = "message",
        event_id: str | None = None,
        **extra: Any,
    ) -> dict[str, Any]:
        """An ``event_callback`` document for a message, as Slack sends it (text escaped)."""
        event: dict[str, Any] = {
            "type": event_type,
            "channel": channel,
            "text": text,
            "ts": ts or self.next_ts(),
            "event_ts": ts or "",
            "channel_type": "channel",
            **extra,
        }
        if user is not None:
            event["user"] = user
        if thread_ts:
            event["thread_ts"] = thread_ts
        return {
            "token": "verification-token-unused",
            "team_id": self.team,
            "api_app_id": "A0000001",
            "type": "event_callback",
            "event_id": event_id or f"Ev{uuid.uuid4().hex[:10].upper()}",
            "event_time": int(time.time()),
            "event": event,
            "authorizations": [{"team_id": self.team, "user_id": self.bot_user, "is_bot": True}],
        }

    # -- Socket Mode ---------------------------------------------------------------

    def push_event(self, callback: dict[str, Any]) -> str:
        """Queue an ``events_api`` envelope carrying ``callback``; returns its envelope id."""
        envelope = {
            "envelope_id": str(uuid.uuid4()),
            "type": "events_api",
            "accepts_response_payload": False,
            "retry_attempt": 0,
            "retry_reason": "",
            "payload": callback,
        }
        self._send(envelope)
        return str(envelope["envelope_id"])

    def push_disconnect(self) -> None:
        """Slack's "refresh your connection" message."""
        self._send({"type": "disconnect", "reason": "refresh_requested", "debug_info": {"host": "fake"}}, track=False)

    def redeliver(self) -> None:
        """Send every unacknowledged envelope again (retry_attempt + 1)."""
        with self._lock:
            again = list(self._pending.values())
        for envelope in again:
            self._send({**envelope, "retry_attempt": int(envelope["retry_attempt"]) + 1, "retry_reason": "timeout"})

    def resend(self, envelope_id: str) -> None:
        """Send an envelope again though it was acknowledged (Slack delivers at least once)."""
        with self._lock:
            envelope = self._envelopes[envelope_id]
        self._send({**envelope, "retry_attempt": int(envelope["retry_attempt"]) + 1, "retry_reason": "timeout"})

    def _send(self, message: dict[str, Any], *, track: bool = True) -> None:
        with self._lock:
            if track:
                self._pending[str(message["envelope_id"])] = message
                self._envelopes[str(message["envelope_id"])] = message
            conns = list(self.connections)
            if not conns:
                self._queue.append(message)
                return
        try:
            conns[-1].send(json.dumps(message))
        except ConnectionClosed:
            with self._lock:
                self._queue.append(message)

    def _socket(self, conn: ServerConnection) -> None:
        conn.send(
            json.dumps(
                {
                    "type": "hello",
                    "num_connections": 1,
                    "debug_info": {"host": "fake-socket-mode", "approximate_connection_time": 18060},
                    "connection_info": {"app_id": "A0000001"},
                }
            )
        )
        with self._lock:
            self.hellos += 1
            self.connections.append(conn)
            queued, self._queue = self._queue, []
        for message in queued:
            conn.send(json.dumps(message))
        try:
            for raw in conn:
                try:
                    doc = json.loads(raw)
                except ValueError:
                    continue
                if isinstance(doc, dict) and "envelope_id" in doc:
                    with self._lock:
                        self.acks.append(str(doc["envelope_id"]))
                        self._pending.pop(str(doc["envelope_id"]), None)
                        self._lock.notify_all()
        except ConnectionClosed:
            pass
        finally:
            with self._lock:
                if conn in self.connections:
                    self.connections.remove(conn)

    def wait_acks(self, n: int, timeout: float = 10) -> list[str]:
        deadline = time.monotonic() + timeout
        with self._lock:
            while len(self.acks) < n and time.monotonic() < deadline:
                self._lock.wait(deadline - time.monotonic())
            return list(self.acks)

    # -- lifecycle ---------------------------------------------------------------

    def __enter__(self) -> FakeSlack:
        threading.Thread(target=self.server.serve_forever, daemon=True, name="fake-slack-web").start()
        threading.Thread(target=self.ws.serve_forever, daemon=True, name="fake-slack-socket").start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.ws.shutdown()
        self.server.shutdown()
        self.server.server_close()

    # -- the Web API ---------------------------------------------------------------

    def _call(self, method: str, token: str, params: dict[str, Any]) -> tuple[int, dict[str, Any], _Failure | None]:
        with self._lock:
            queue = self._failures.get(method)
            failure = queue.pop(0) if queue else None
        if failure is not None:
            return failure.status, {"ok": False, "error": failure.error}, failure
        if method == "apps.connections.open":
            if token != self.app_token:
                return 200, {"ok": False, "error": "not_allowed_token_type"}, None
            return 200, {"ok": True, "url": f"{self.ws_url}?ticket={uuid.uuid4()}&app_id=A0000001"}, None
        if token != self.bot_token:
            return 200, {"ok": False, "error": "invalid_auth"}, None
        if method == "auth.test":
            return (
                200,
                {
                    "ok": True,
                    "url": "https://fake.slack.com/",
                    "team": "Fake",
                    "user": "robo",
                    "team_id": self.team,
                    "user_id": self.bot_user,
                    "bot_id": "B0000001",
                },
                None,
            )
        if method == "users.info":
            user = str(params.get("user") or "")
            if user not in self.users:
                return 200, {"ok": False, "error": "user_not_found"}, None
            return (
                200,
                {
                    "ok": True,
                    "user": {
                        "id": user,
                        "name": user.lower(),
                        "profile": {"display_name": self.users[user], "real_name": self.users[user]},
                    },
                },
                None,
            )
        if method in ("chat.postMessage", "chat.postEphemeral", "chat.update"):
            problem = self._check_message(params)
            if problem:
                return 200, {"ok": False, "error": problem}, None
        if method == "chat.postMessage":
            post = Post(
                channel=str(params["channel"]),
                ts=self.next_ts(),
                text=str(params.get("text") or ""),
                blocks=list(params.get("blocks") or []),
                thread_ts=params.get("thread_ts"),
            )
            with self._lock:
                self.posts.append(post)
            return (
                200,
                {
                    "ok": True,
                    "channel": post.channel,
                    "ts": post.ts,
                    "message": {
                        "type": "message",
                        "text": post.text,
                        "ts": post.ts,
                        "bot_id": "B0000001",
                        "user": self.bot_user,
                    },
                },
                None,
            )
        if method == "chat.postEphemeral":
            return 200, {"ok": True, "message_ts": self.next_ts()}, None
        if method in ("chat.update", "chat.delete"):
            with self._lock:
                found = [
                    p
                    for p in self.posts
                    if p.channel == params.get("channel") and p.ts == params.get("ts") and not p.deleted
                ]
                if not found:
                    return 200, {"ok": False, "error": "message_not_found"}, None
                if method == "chat.delete":
                    found[0].deleted = True
                else:
                    found[0].text = str(params.get("text") or "")
                    found[0].blocks = list(params.get("blocks") or [])
                    found[0].updates += 1
            return 200, {"ok": True, "channel": params["channel"], "ts": params["ts"]}, None
        return 200, {"ok": False, "error": "unknown_method"}, None

    @staticmethod
    def _check_message(params: dict[str, Any]) -> str | None:
        if not params.get("channel"):
            return "channel_not_found"
        blocks = params.get("blocks")
        if isinstance(blocks, str):
            blocks = json.loads(blocks)
            params["blocks"] = blocks
        if not params.get("text") and not blocks:
            return "no_text"
        if blocks:
            if len(blocks) > BLOCKS_LIMIT:
                return "invalid_blocks"
            for block in blocks:
                texts = (
                    [block["text"]["text"]]
                    if block.get("type") == "section"
                    else [e["text"] for e in block.get("elements", [])]
                )
                if any(len(t) > SECTION_LIMIT or not t for t in texts):
                    return "invalid_blocks"
        if len(str(params.get("text") or "")) > 40_000:
            return "msg_too_long"
        return None

    def _handler(self) -> type[BaseHTTPRequestHandler]:
        fake = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def do_POST(self) -> None:  # noqa: N802 - http.server's naming
                url = urlsplit(self.path)
                body = self.rfile.read(int(self.headers.get("content-length") or 0))
                params: dict[str, Any] = dict(parse_qsl(url.query))
                ctype = (self.headers.get("content-type") or "").split(";")[0].strip()
                if body and ctype == "application/json":
                    params.update(json.loads(body))
                elif body:
                    params.update(parse_qsl(body.decode()))
                auth = self.headers.get("authorization") or ""
                token = auth.removeprefix("Bearer ").strip() or str(params.pop("token", ""))
                method = url.path.removeprefix("/api/")
                if not url.path.startswith("/api/"):
                    status, doc, failure = 404, {"ok": False, "error": "unknown_method"}, None
                else:
                    status, doc, failure = fake._call(method, token, params)
                with fake._lock:
                    fake.requests.append(
                        Request(method, params, token, status, None if doc.get("ok") else str(doc.get("error")))
                    )
                headers = {}
                if failure is not None and failure.retry_after is not None:
                    headers["Retry-After"] = str(failure.retry_after)
                data = (
                    failure.raw.encode()
                    if failure is not None and failure.raw is not None
                    else json.dumps(doc).encode()
                )
                self.send_response(status)
                self.send_header(
                    "content-type",
                    "text/html"
                    if failure is not None and failure.raw is not None
                    else "application/json; charset=utf-8",
                )
                for name, value in headers.items():
                    self.send_header(name, value)
                self.send_header("content-length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def log_message(self, *args: object) -> None:
                pass

        return Handler


@pytest.fixture(name="fake")
def fake_slack() -> Iterator[FakeSlack]:
    """A fake Slack for one test (used by name: ``fake``)."""
    with FakeSlack() as api:
        yield api
