"""A fake Telegram Bot API on loopback, speaking the real wire format.

``POST``/``GET`` ``/bot<token>/<method>`` with parameters as a query string,
a form (what python-telegram-bot sends) or JSON; answers
``{"ok": true, "result": ...}`` or ``{"ok": false, "error_code": ...,
"description": ..., "parameters": {"retry_after": n}}``.  Methods:
``getMe``, ``sendMessage`` (rejects text over 4096 UTF-16 units, as the real
one does), ``getUpdates`` (``offset`` confirms earlier updates, ``timeout``
long-polls), ``close``/``logOut`` (for shutdown).  A wrong token is a 401.

Tests script it: :meth:`FakeTelegramAPI.fail` makes the next calls of a
method fail (500, or 429 with ``retry_after``), :meth:`push_text` queues an
incoming text message; every request is kept in ``requests``.
"""

from __future__ import annotations

import json
import threading
import time
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import parse_qsl, urlsplit

TEXT_LIMIT = 4096


def utf16_len(text: str) -> int:
    return len(text.encode("utf-16-le")) // 2


@dataclass
class Request:
    method: str  # the Bot API method: sendMessage, getUpdates, ...
    http_method: str
    params: dict[str, Any]
    status: int = 200


@dataclass
class _Failure:
    status: int
    description: str
    retry_after: int | None


@dataclass
class FakeTelegramAPI:
    token: str = "123456:TEST-token"
    bot_id: int = 123456
    requests: list[Request] = field(default_factory=list)
    updates: list[dict[str, Any]] = field(default_factory=list)

    def __post_init__(self) -> None:
        self._lock = threading.Condition()
        self._failures: dict[str, list[_Failure | None]] = {}
        self._next_update_id = 1000
        self._next_message_id = 1
        self.server = ThreadingHTTPServer(("127.0.0.1", 0), self._handler())
        self.server.daemon_threads = True
        self.base = f"http://127.0.0.1:{self.server.server_address[1]}"

    # -- scripting ---------------------------------------------------------------

    def fail(
        self,
        method: str,
        status: int = 500,
        *,
        times: int = 1,
        after: int = 0,
        retry_after: int | None = None,
        description: str | None = None,
    ) -> None:
        """The next ``times`` calls of ``method`` (after ``after`` good ones) fail with ``status``."""
        desc = description or (
            f"Too Many Requests: retry after {retry_after or 1}" if status == 429 else "Internal Server Error"
        )
        with self._lock:
            script = self._failures.setdefault(method, [])
            script.extend([None] * after)
            script.extend(
                _Failure(status, desc, retry_after if status != 429 else (retry_after or 1)) for _ in range(times)
            )

    def push_update(self, update: dict[str, Any]) -> dict[str, Any]:
        with self._lock:
            if "update_id" not in update:
                self._next_update_id += 1
                update = {"update_id": self._next_update_id, **update}
            self.updates.append(update)
            self._lock.notify_all()
        return update

    def push_text(
        self,
        chat_id: int,
        user_id: int,
        text: str,
        *,
        first_name: str = "Ann",
        last_name: str = "",
        chat_type: str = "group",
        message_id: int | None = None,
    ) -> dict[str, Any]:
        """An incoming text message (a new update; ``message_id`` repeats one, as a redelivery would)."""
        with self._lock:
            if message_id is None:
                message_id = self._next_message_id
                self._next_message_id += 1
        user: dict[str, Any] = {"id": user_id, "is_bot": False, "first_name": first_name}
        if last_name:
            user["last_name"] = last_name
        chat: dict[str, Any] = {"id": chat_id, "type": chat_type}
        if chat_type == "private":
            chat["first_name"] = first_name
        else:
            chat["title"] = f"chat {chat_id}"
        return self.push_update(
            {"message": {"message_id": message_id, "date": int(time.time()), "chat": chat, "from": user, "text": text}}
        )

    def calls(self, method: str, *, ok_only: bool = False) -> list[Request]:
        with self._lock:
            return [r for r in self.requests if r.method == method and (r.status == 200 or not ok_only)]

    def sent(self) -> list[tuple[str, str]]:
        """(chat_id, text) of every accepted sendMessage, in order."""
        return [(str(r.params["chat_id"]), str(r.params["text"])) for r in self.calls("sendMessage", ok_only=True)]

    # -- lifecycle ---------------------------------------------------------------

    def __enter__(self) -> FakeTelegramAPI:
        threading.Thread(target=self.server.serve_forever, daemon=True, name="fake-telegram").start()
        return self

    def __exit__(self, *exc: object) -> None:
        with self._lock:
            self._lock.notify_all()
        self.server.shutdown()
        self.server.server_close()

    # -- the API -----------------------------------------------------------------

    def _bot_user(self) -> dict[str, Any]:
        return {
            "id": self.bot_id,
            "is_bot": True,
            "first_name": "Fake",
            "username": "fake_test_bot",
            "can_join_groups": True,
            "can_read_all_group_messages": False,
            "supports_inline_queries": False,
        }

    def _call(self, method: str, params: dict[str, Any]) -> tuple[int, dict[str, Any]]:
        with self._lock:
            queue = self._failures.get(method)
            failure = queue.pop(0) if queue else None
        if failure is not None:
            doc: dict[str, Any] = {"ok": False, "error_code": failure.status, "description": failure.description}
            if failure.retry_after is not None:
                doc["parameters"] = {"retry_after": failure.retry_after}
            return failure.status, doc
        if method == "getMe":
            return 200, {"ok": True, "result": self._bot_user()}
        if method in ("close", "logOut", "deleteWebhook"):
            return 200, {"ok": True, "result": True}
        if method == "sendMessage":
            text, chat_id = params.get("text"), params.get("chat_id")
            if chat_id in (None, ""):
                return 400, {"ok": False, "error_code": 400, "description": "Bad Request: chat_id is empty"}
            if not text:
                return 400, {"ok": False, "error_code": 400, "description": "Bad Request: message text is empty"}
            if utf16_len(str(text)) > TEXT_LIMIT:
                return 400, {"ok": False, "error_code": 400, "description": "Bad Request: message is too long"}
            with self._lock:
                mid = self._next_message_id
                self._next_message_id += 1
            try:
                chat: dict[str, Any] = {"id": int(chat_id), "type": "group", "title": "chat"}
            except ValueError:
                chat = {"id": -1001, "type": "channel", "title": str(chat_id), "username": str(chat_id).lstrip("@")}
            return 200, {
                "ok": True,
                "result": {
                    "message_id": mid,
                    "date": int(time.time()),
                    "chat": chat,
                    "from": self._bot_user(),
                    "text": str(text),
                },
            }
        if method == "getUpdates":
            offset = int(params.get("offset") or 0)
            timeout = float(params.get("timeout") or 0)
            deadline = time.monotonic() + timeout
            with self._lock:
                if offset:  # confirms every update before it, as the real API does
                    self.updates = [u for u in self.updates if u["update_id"] >= offset]
                while not self.updates and time.monotonic() < deadline:
                    self._lock.wait(deadline - time.monotonic())
                    if offset:
                        self.updates = [u for u in self.updates if u["update_id"] >= offset]
                limit = int(params.get("limit") or 100)
                return 200, {"ok": True, "result": list(self.updates[:limit])}
        return 404, {"ok": False, "error_code": 404, "description": "Not Found"}

    def _handler(self) -> type[BaseHTTPRequestHandler]:
        fake = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def _serve(self) -> None:
                url = urlsplit(self.path)
                body = self.rfile.read(int(self.headers.get("content-length") or 0))
                params: dict[str, Any] = dict(parse_qsl(url.query))
                ctype = (self.headers.get("content-type") or "").split(";")[0].strip()
                if body and ctype == "application/json":
                    params.update(json.loads(body))
                elif body and ctype == "application/x-www-form-urlencoded":
                    params.update(parse_qsl(body.decode()))
                elif body and ctype.startswith("multipart/"):
                    self._reply(400, {"ok": False, "error_code": 400, "description": "multipart not supported"})
                    return
                prefix, _, method = url.path.lstrip("/").partition("/")
                if prefix != f"bot{fake.token}":
                    status, doc = 401, {"ok": False, "error_code": 401, "description": "Unauthorized"}
                else:
                    status, doc = fake._call(method, params)
                with fake._lock:
                    fake.requests.append(Request(method, self.command, params, status))
                self._reply(status, doc)

            def _reply(self, status: int, doc: dict[str, Any]) -> None:
                data = json.dumps(doc).encode()
                self.send_response(status)
                self.send_header("content-type", "application/json")
                self.send_header("content-length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            do_GET = do_POST = _serve  # noqa: N815 - http.server's naming

            def log_message(self, *args: object) -> None:
                pass

        return Handler
