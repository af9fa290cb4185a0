"""A fake Slack on loopback, speaking the real wire formats: the Web API and Socket Mode.

**Web API**: ``POST /api/<method>`` with ``Authorization: Bearer <token>`` and
JSON (what slack_sdk's ``api_call(json=...)`` sends) or a form (what its
generated methods send), answering ``{"ok": true, ...}`` or ``{"ok": false,
"error": "..."}`` as Slack does (a wrong token: ``invalid_auth``).  Methods:
``auth.test``, ``users.info``, ``chat.postMessage`` (refuses more than 50 blocks,
a section text over 3,000 characters and an actions block's button Slack would not
take, ``msg_too_long``/``invalid_blocks`` as the real one), ``chat.update``, ``chat.delete``, ``chat.postEphemeral``,
``reactions.add`` (a known emoji name on a bot's post or a message event made here:
``invalid_name``, ``message_not_found``, ``already_reacted`` as Slack answers; kept in
``reactions``), and ``apps.connections.open`` (the app-level token only), which answers the
``ws://127.0.0.1:<port>/link/?ticket=...`` of the fake Socket Mode server.

**Files**: :meth:`FakeSlack.host_file` serves bytes at ``/files-pri/<team>-<id>/...``
(``url_private``, and ``.../download/<name>``: ``url_private_download``) and returns the
file object a ``file_share`` event carries; a download needs ``Authorization: Bearer``
with the bot token (without it: a 302 to the workspace's sign-in page, as Slack answers),
and each one is logged in ``downloads``.  A hosted file can lie about its size (the file
object's ``size``, ``Content-Length`` left out), redirect elsewhere, answer an HTML page or
send its bytes slowly.  The external upload flow: ``files.getUploadURLExternal`` (a form:
``filename``, ``length``; ``missing_argument`` for a length of 0) answers an ``upload_url``
on this server and a ``file_id``; ``POST /upload/v1/<ticket>`` takes the raw bytes (no
token: the URL is the credential; the length must be the one announced) and answers
``OK - <length>``; ``files.completeUploadExternal`` (a form: ``files`` a JSON array of
``{id, title}``, ``channel_id``, ``thread_ts``, ``initial_comment``) shares uploaded
files, once each (``file_not_found`` for a file not uploaded or already shared);
``files.delete`` (``file``) takes a shared file back (``file_not_found``, or
``file_deleted`` once deleted).  Every
upload is kept in ``uploads``; :attr:`FakeSlack.upload_base` can point the answered URLs
elsewhere.

:meth:`FakeSlack.changed_event` is the ``message_changed`` event of an edit (the message
as it is now under ``message``, its author and its editor).

Tests script it: :meth:`FakeSlack.fail` makes the next calls of a method fail
(HTTP 429 with ``Retry-After`` and ``{"ok": false, "error": "ratelimited"}``,
or a 500, or any error answer; ``upload`` names the upload POST); every request
is kept in ``requests`` (a download as method ``download``, an upload's bytes as
``upload``).

**Socket Mode**: a websocket server (the ``websockets`` library) that sends
``{"type": "hello", ...}`` to each connection, then the ``events_api``
envelopes :meth:`FakeSlack.push_event` queues (``envelope_id``, ``payload``:
the ``event_callback`` document, ``retry_attempt``), and records each
``{"envelope_id": ...}`` acknowledgement.  An envelope not acknowledged is sent
again, ``retry_attempt`` + 1, to the next connection (:meth:`redeliver`, or on
connect), as Slack does.  :meth:`FakeSlack.click` makes the ``block_actions`` payload of a
click on a post's button, for ``POST /slack/interactions`` or Socket Mode's ``interactive``
envelope (:meth:`push_interactive`).
"""

from __future__ import annotations

import json
import secrets
import threading
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import parse_qsl, quote, urlsplit

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


# Slack short names of standard emoji this fake knows (a workspace knows these and more).
SLACK_EMOJI_NAMES = frozenset(
    "+1 thumbsup -1 thumbsdown heart fire tada clap grin smile thinking_face cry pray ok_hand 100 "
    "rolling_on_the_floor_laughing joy zap trophy eyes handshake writing_hand sunglasses exploding_head "
    "heart_eyes saluting_face white_check_mark heavy_check_mark x hourglass_flowing_sand hourglass rocket "
    "warning bug wave raised_hands star sparkles".split()
)


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
class HostedFile:
    """A file served at ``path`` (and ``path`` + ``download/``) as the script says."""

    id: str
    name: str
    data: bytes
    content_type: str
    content_length: bool = True  # False: no Content-Length header (the size is learnt by reading)
    redirect: str | None = None  # answer 302 to this Location instead of the bytes
    drip_s: float = 0.0  # a pause before each 1 KiB piece


@dataclass
class Download:
    path: str
    token: str
    status: int


@dataclass
class Upload:
    """One files.getUploadURLExternal ticket and what became of it."""

    file_id: str
    filename: str
    length: int
    ticket: str
    data: bytes | None = None  # the bytes POSTed to its upload_url
    channel: str | None = None  # shared by files.completeUploadExternal: where
    thread_ts: str | None = None
    title: str | None = None
    initial_comment: str | None = None
    deleted: bool = False  # files.delete took it back


@dataclass
class FakeSlack:
    bot_token: str = "xoxb-fake-bot-token"
    app_token: str = "xapp-fake-app-token"
    bot_user: str = "UBOT0001"
    team: str = "T0000001"
    requests: list[Request] = field(default_factory=list)
    posts: list[Post] = field(default_factory=list)
    users: dict[str, str] = field(default_factory=lambda: {"UANN0001": "Ann Lee", "UBOB0002": "Bob"})
    downloads: list[Download] = field(default_factory=list)
    uploads: list[Upload] = field(default_factory=list)

    def __post_init__(self) -> None:
        self._lock = threading.Condition()
        self._failures: dict[str, list[_Failure | None]] = {}
        self._ts = int(time.time()) * 1_000_000
        self.pushed: set[tuple[str, str]] = set()  # (channel, ts) of the message events made
        self.reactions: dict[tuple[str, str], list[str]] = {}  # the bot's reaction names on each message
        self.server = ThreadingHTTPServer(("127.0.0.1", 0), self._handler())
        self.server.daemon_threads = True
        self.root = f"http://127.0.0.1:{self.server.server_address[1]}"
        self.base = f"{self.root}/api/"
        self.upload_base = f"{self.root}/upload/v1/"  # where upload_url points (a test may move it)
        self.hosted: dict[str, HostedFile] = {}  # by path
        self._file_seq = 0
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
        event_ts, ts = ts or "", ts or self.next_ts()
        with self._lock:
            self.pushed.add((channel, ts))
        event: dict[str, Any] = {
            "type": event_type,
            "channel": channel,
            "text": text,
            "ts": ts,
            "event_ts": event_ts,
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

    def click(self, post: Post, user: str, action_id: str) -> dict[str, Any]:
        """The ``block_actions`` payload Slack sends when ``user`` clicks the button
        ``action_id`` of ``post`` (KeyError: the post has no such button)."""
        (button,) = [
            e
            for b in post.blocks
            if b.get("type") == "actions"
            for e in b.get("elements", [])
            if e.get("action_id") == action_id
        ]
        block_id = next(b.get("block_id") for b in post.blocks if button in b.get("elements", []))
        return {
            "type": "block_actions",
            # As Slack sends it: the handle in both (the name people see is users.info's).
            "user": {"id": user, "username": user.lower(), "name": user.lower(), "team_id": self.team},
            "api_app_id": "A0000001",
            "token": "verification-token-unused",
            "container": {"type": "message", "message_ts": post.ts, "channel_id": post.channel, "is_ephemeral": False},
            "trigger_id": f"{int(time.time())}.{uuid.uuid4().int % 10**12}",
            "team": {"id": self.team, "domain": "fake"},
            "channel": {"id": post.channel, "name": "team"},
            "message": {"type": "message", "ts": post.ts, "text": post.text, "blocks": post.blocks},
            "response_url": f"{self.root}/actions/{uuid.uuid4().hex}",
            "actions": [
                {
                    "action_id": action_id,
                    "block_id": block_id,
                    "text": button["text"],
                    "value": button.get("value"),
                    "type": "button",
                    "action_ts": f"{time.time():.6f}",
                }
            ],
        }

    def push_interactive(self, payload: dict[str, Any]) -> str:
        """Queue Socket Mode's ``interactive`` envelope carrying ``payload``; its envelope id."""
        envelope = {
            "envelope_id": str(uuid.uuid4()),
            "type": "interactive",
            "accepts_response_payload": False,
            "payload": payload,
        }
        self._send(envelope)
        return str(envelope["envelope_id"])

    def ephemerals(self, user: str) -> list[str]:
        """The texts told to ``user`` alone (``chat.postEphemeral``)."""
        return [
            str(r.params.get("text"))
            for r in self.calls("chat.postEphemeral", ok_only=True)
            if r.params.get("user") == user
        ]

    def changed_event(
        self, channel: str, author: str, ts: str, text: str, *, editor: str | None = None, bot_id: str | None = None
    ) -> dict[str, Any]:
        """A ``message_changed`` event, as Slack sends one when ``editor`` (the author unless
        given) edits ``author``'s message ``ts``: the message as it is now under ``message``."""
        now = self.next_ts()
        message: dict[str, Any] = {
            "type": "message",
            "user": author,
            "text": text,
            "ts": ts,
            "edited": {"user": editor or author, "ts": now},
        }
        if bot_id is not None:
            message["bot_id"] = bot_id
        doc = self.message_event(
            channel,
            None,
            "",
            ts=now,
            subtype="message_changed",
            hidden=True,
            message=message,
            previous_message={"type": "message", "user": author, "text": "(before)", "ts": ts},
        )
        del doc["event"]["text"]
        return doc

    # -- files ---------------------------------------------------------------------

    def host_file(
        self,
        name: str,
        data: bytes,
        *,
        mimetype: str = "text/plain",
        size: int | None = None,
        content_type: str | None = None,
        content_length: bool = True,
        redirect: str | None = None,
        drip_s: float = 0.0,
        root: str | None = None,
    ) -> dict[str, Any]:
        """Serve ``data`` as a Slack file named ``name``; returns the file object a message
        event carries (``size``: what it declares, the true size unless given; ``root``: the
        origin its URLs name, this server unless given)."""
        with self._lock:
            self._file_seq += 1
            file_id = f"F{self._file_seq:08d}"
        path = f"/files-pri/{self.team}-{file_id}/{quote(name, safe='')}"
        hosted = HostedFile(file_id, name, data, content_type or mimetype, content_length, redirect, drip_s)
        with self._lock:
            self.hosted[path] = hosted
            self.hosted[f"/files-pri/{self.team}-{file_id}/download/{quote(name, safe='')}"] = hosted
        where = root or self.root
        return {
            "id": file_id,
            "created": int(time.time()),
            "timestamp": int(time.time()),
            "name": name,
            "title": name,
            "mimetype": mimetype,
            "filetype": "text",
            "pretty_type": "Plain Text",
            "user": "UANN0001",
            "user_team": self.team,
            "editable": False,
            "size": len(data) if size is None else size,
            "mode": "hosted",
            "is_external": False,
            "external_type": "",
            "is_public": False,
            "public_url_shared": False,
            "display_as_bot": False,
            "username": "",
            "url_private": f"{where}{path}",
            "url_private_download": f"{where}/files-pri/{self.team}-{file_id}/download/{quote(name, safe='')}",
            "permalink": f"https://fake.slack.com/files/UANN0001/{file_id}/{quote(name, safe='')}",
            "is_starred": False,
            "has_rich_preview": False,
            "file_access": "visible",
        }

    def shared(self, channel: str | None = None) -> list[Upload]:
        """The uploads completed (shared), in order, in ``channel`` if given."""
        with self._lock:
            return [u for u in self.uploads if u.channel is not None and (channel is None or u.channel == channel)]

    def _serve_file(self, handler: BaseHTTPRequestHandler, token: str) -> None:
        path = urlsplit(handler.path).path
        with self._lock:
            hosted = self.hosted.get(path)
        status = 200 if hosted is not None and token == self.bot_token else 404 if hosted is None else 302
        if hosted is not None and hosted.redirect is not None and status == 200:
            status = 302
        with self._lock:
            self.downloads.append(Download(path, token, status))
            self.requests.append(Request("download", {"path": path}, token, status))
        if status == 404:
            _answer(handler, 404, b"Not Found", "text/plain")
            return
        if status == 302:
            assert hosted is not None
            # Slack sends a request without a good token to the workspace's sign-in page.
            location = hosted.redirect if token == self.bot_token else f"https://fake.slack.com/?redir={quote(path)}"
            _answer(handler, 302, b"", "text/plain", {"Location": str(location)})
            return
        assert hosted is not None
        handler.send_response(200)
        handler.send_header("content-type", hosted.content_type)
        if hosted.content_length:
            handler.send_header("content-length", str(len(hosted.data)))
        else:
            handler.send_header("connection", "close")
        handler.end_headers()
        try:
            for start in range(0, len(hosted.data), 1024):
                if hosted.drip_s:
                    time.sleep(hosted.drip_s)
                handler.wfile.write(hosted.data[start : start + 1024])
                handler.wfile.flush()
        except OSError:  # the client went away (it stopped reading: too large, too slow)
            pass
        if not hosted.content_length:
            handler.close_connection = True

    def _take_upload(self, handler: BaseHTTPRequestHandler, body: bytes) -> None:
        ticket = urlsplit(handler.path).path.removeprefix("/upload/v1/")
        with self._lock:
            queue = self._failures.get("upload")
            failure = queue.pop(0) if queue else None
            found = [u for u in self.uploads if u.ticket == ticket and u.data is None]
        status = failure.status if failure is not None else 200 if found else 404
        if status == 200 and len(body) != found[0].length:
            status = 400  # not the length files.getUploadURLExternal was told
        with self._lock:
            if status == 200:
                found[0].data = body
            self.requests.append(Request("upload", {"ticket": ticket, "bytes": len(body)}, "", status))
        text = f"OK - {len(body)}" if status == 200 else "Bad request" if status == 400 else "Not Found"
        _answer(handler, status, text.encode(), "text/plain")

    def _get_upload_url(self, params: dict[str, Any]) -> tuple[int, dict[str, Any], None]:
        filename = str(params.get("filename") or "")
        length = str(params.get("length") or "")
        if not filename or not length.isdigit() or int(length) == 0:
            return 200, {"ok": False, "error": "missing_argument"}, None
        with self._lock:
            self._file_seq += 1
            upload = Upload(f"F{self._file_seq:08d}", filename, int(length), secrets.token_urlsafe(16))
            self.uploads.append(upload)
        return 200, {"ok": True, "upload_url": f"{self.upload_base}{upload.ticket}", "file_id": upload.file_id}, None

    def _complete_upload(self, params: dict[str, Any]) -> tuple[int, dict[str, Any], None]:
        try:
            files = json.loads(str(params.get("files") or ""))
        except ValueError:
            return 200, {"ok": False, "error": "invalid_arguments"}, None
        if not isinstance(files, list) or not files or not all(isinstance(f, dict) and f.get("id") for f in files):
            return 200, {"ok": False, "error": "invalid_arguments"}, None
        channel = params.get("channel_id")
        if params.get("thread_ts") and not channel:
            return 200, {"ok": False, "error": "invalid_arguments"}, None
        with self._lock:
            by_id = {u.file_id: u for u in self.uploads}
            chosen = [by_id.get(str(f["id"])) for f in files]
            if any(u is None or u.data is None or u.channel is not None for u in chosen):
                return 200, {"ok": False, "error": "file_not_found"}, None
            for f, u in zip(files, chosen, strict=True):
                assert u is not None
                u.channel = str(channel or "")
                u.thread_ts = params.get("thread_ts") or None
                u.title = f.get("title") or u.filename
                u.initial_comment = params.get("initial_comment") or None
        return 200, {"ok": True, "files": [{"id": f["id"], "title": f.get("title") or ""} for f in files]}, None

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
        # Named "fake-..." and joined on exit: tests/conftest.py fails a run that leaves one running.
        self._threads = [
            threading.Thread(target=self.server.serve_forever, args=(0.05,), daemon=True, name="fake-slack-web"),
            threading.Thread(target=self.ws.serve_forever, daemon=True, name="fake-slack-socket"),
        ]
        for thread in self._threads:
            thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.ws.shutdown()  # closes the open connections and waits for their handlers
        self.server.shutdown()
        self.server.server_close()
        for thread in self._threads:
            thread.join()

    # -- the Web API ---------------------------------------------------------------

    def _call(self, method: str, token: str, params: dict[str, Any]) -> tuple[int, dict[str, Any], _Failure | None]:  # noqa: C901 - the fake's API: one branch a method
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
        if method == "files.getUploadURLExternal":
            return self._get_upload_url(params)
        if method == "files.completeUploadExternal":
            return self._complete_upload(params)
        if method == "files.delete":
            with self._lock:
                found = [u for u in self.uploads if u.file_id == params.get("file") and u.channel is not None]
                if not found:
                    return 200, {"ok": False, "error": "file_not_found"}, None
                if found[0].deleted:
                    return 200, {"ok": False, "error": "file_deleted"}, None
                found[0].deleted = True
            return 200, {"ok": True}, None
        if method == "reactions.add":
            return self._react(params)
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

    def _react(self, params: dict[str, Any]) -> tuple[int, dict[str, Any], _Failure | None]:
        """reactions.add (channel, timestamp, name) on a post of the bot's or a message pushed."""
        channel, ts, name = params.get("channel"), params.get("timestamp"), params.get("name")
        if not channel or not ts or not name:
            return 200, {"ok": False, "error": "no_item_specified"}, None
        if name not in SLACK_EMOJI_NAMES:
            return 200, {"ok": False, "error": "invalid_name"}, None
        with self._lock:
            posted = any(p.channel == channel and p.ts == ts and not p.deleted for p in self.posts)
            if not posted and (channel, ts) not in self.pushed:
                return 200, {"ok": False, "error": "message_not_found"}, None
            names = self.reactions.setdefault((str(channel), str(ts)), [])
            if name in names:
                return 200, {"ok": False, "error": "already_reacted"}, None
            names.append(str(name))
        return 200, {"ok": True}, None

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
                if block.get("type") == "actions":
                    if not _buttons_fit(block.get("elements") or []):
                        return "invalid_blocks"
                    continue
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

            def do_GET(self) -> None:  # http.server's naming
                auth = self.headers.get("authorization") or ""
                if urlsplit(self.path).path.startswith("/files-pri/"):
                    fake._serve_file(self, auth.removeprefix("Bearer ").strip())
                    return
                with fake._lock:
                    fake.requests.append(Request("GET " + urlsplit(self.path).path, {}, "", 404))
                _answer(self, 404, b"Not Found", "text/plain")

            def do_POST(self) -> None:  # http.server's naming
                url = urlsplit(self.path)
                body = self.rfile.read(int(self.headers.get("content-length") or 0))
                if url.path.startswith("/upload/v1/"):
                    fake._take_upload(self, body)
                    return
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


def _buttons_fit(elements: list[Any]) -> bool:
    """An actions block as Slack takes it: 1 to 25 buttons, each with a plain_text label of 1
    to 75 characters and a unique action_id of at most 255."""
    ids = [e.get("action_id") for e in elements if isinstance(e, dict)]
    return (
        1 <= len(elements) <= 25
        and len(set(ids)) == len(elements)
        and all(
            e.get("type") == "button"
            and e.get("text", {}).get("type") == "plain_text"
            and 1 <= len(e.get("text", {}).get("text") or "") <= 75
            and 1 <= len(e.get("action_id") or "") <= 255
            for e in elements
        )
    )


def _answer(
    handler: BaseHTTPRequestHandler, status: int, body: bytes, ctype: str, headers: dict[str, str] | None = None
) -> None:
    handler.send_response(status)
    handler.send_header("content-type", ctype)
    for name, value in (headers or {}).items():
        handler.send_header(name, value)
    handler.send_header("content-length", str(len(body)))
    handler.end_headers()
    handler.wfile.write(body)


@pytest.fixture(name="fake")
def fake_slack() -> Iterator[FakeSlack]:
    """A fake Slack for one test (used by name: ``fake``)."""
    with FakeSlack() as api:
        yield api
