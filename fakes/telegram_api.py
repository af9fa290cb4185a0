"""A fake Telegram Bot API on loopback, speaking the real wire format.

``POST``/``GET`` ``/bot<token>/<method>`` with parameters as a query string,
a form (what python-telegram-bot sends), JSON, or ``multipart/form-data`` (an
upload: each field a part, the file a part with a ``filename``); answers
``{"ok": true, "result": ...}`` or ``{"ok": false, "error_code": ...,
"description": ..., "parameters": {"retry_after": n}}``.  Methods:
``getMe``, ``sendMessage`` (rejects text over 4096 UTF-16 units, as the real
one does), ``getUpdates`` (``offset`` confirms earlier updates, ``timeout``
long-polls), ``getFile`` (a ``File``: ``file_id``, ``file_unique_id``,
``file_size``, ``file_path``), ``sendPhoto`` and ``sendDocument`` (a multipart
upload of the ``photo`` or ``document`` part; a photo over 10 MB is refused, as
the real one refuses it), ``editMessageText`` and ``editMessageCaption`` (the bot's own
messages; Telegram's errors for one not found, one with no text or caption to edit, and
content not modified), ``deleteMessage`` (a message older than 48 hours is refused with
Telegram's 400 "Bad Request: message can't be deleted for everyone"; see :meth:`age`),
``answerCallbackQuery`` (a ``callback_query_id`` it sent, answered once; text within 200
characters), ``editMessageReplyMarkup`` (a keyboard changed or taken off),
``setMessageReaction`` (of a message the bot sent or an update it was given: one emoji of
Telegram's fixed set for bots, else 400 "Bad Request: REACTION_INVALID"; the bot's reaction
on a message replaces its earlier one, kept in ``reactions``), ``close``/``logOut`` (for
shutdown).  A ``reply_markup`` is checked as
Telegram checks an inline keyboard (``BUTTON_DATA_INVALID`` for ``callback_data`` over 64
bytes, ``BUTTON_TEXT_EMPTY``) and kept with the message.  Every message the bot sent is kept in ``messages``
(its text or caption now, deleted or not, how often edited).  ``GET
/file/bot<token>/<file_path>`` is the download of a file ``getFile`` named
(recorded as the method ``file``).  A wrong token is a 401.

Tests script it: :meth:`FakeTelegramAPI.fail` makes the next calls of a
method fail (500, or 429 with ``retry_after``), :meth:`push_text`,
:meth:`push_document` and :meth:`push_photo` queue incoming messages (:meth:`push_edit`
an ``edited_message``), and
:meth:`press` a press on a button of the bot's message (a ``callback_query``) (a
document's or photo's bytes are then served by ``getFile`` and the download;
:meth:`FakeFile` fields may be changed to lie about its size or path, and
``delay_s`` drips the download); every request is kept in ``requests``, an
upload's file part as an :class:`Upload`.
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import parse_qsl, unquote, urlsplit

from python_multipart.multipart import MultipartParser, parse_options_header

TEXT_LIMIT = 4096
PHOTO_MAX_BYTES = 10 * 1000 * 1000
DOWNLOAD_CHUNK = 4096


def utf16_len(text: str) -> int:
    return len(text.encode("utf-16-le")) // 2


@dataclass
class Request:
    method: str  # the Bot API method: sendMessage, getUpdates, ...
    http_method: str
    params: dict[str, Any]
    status: int = 200


@dataclass
class Upload:
    """A file part of a multipart request, as it arrived."""

    filename: str
    content_type: str
    data: bytes


@dataclass
class FakeFile:
    """A file the fake holds: what getFile says of it and the bytes its download serves."""

    file_id: str
    file_unique_id: str
    file_path: str  # what getFile answers (a test may make it hostile)
    data: bytes
    file_size: int | None  # what the message and getFile declare (a test may make it lie)
    delay_s: float = 0.0  # between chunks of the download
    content_encoding: str | None = None  # the download's Content-Encoding header, if any
    on_download: Callable[[], object] | None = None  # called as the download starts (a race, scripted)


@dataclass
class SentMessage:
    """A message the bot sent, as it stands now."""

    chat_id: str
    message_id: int
    kind: str  # text | photo | document
    text: str | None  # a text message's text
    caption: str | None  # a photo's or a document's
    date: float
    deleted: bool = False
    edits: int = 0
    reply_markup: dict[str, Any] | None = None  # an inline keyboard sent with it


# The emoji a bot may react with (Bot API, ReactionTypeEmoji), as Telegram spells them.
BOT_REACTIONS = frozenset(
    "👍 👎 ❤ 🔥 🥰 👏 😁 🤔 🤯 😱 🤬 😢 🎉 🤩 🤮 💩 🙏 👌 🕊 🤡 🥱 🥴 😍 🐳 ❤‍🔥 🌚 🌭 💯 🤣 ⚡ 🍌 🏆 💔 🤨 😐 🍓 🍾 💋 "
    "🖕 😈 😴 😭 🤓 👻 👨‍💻 👀 🎃 🙈 😇 😨 🤝 ✍ 🤗 🫡 🎅 🎄 ☃ 💅 🤪 🗿 🆒 💘 🙉 🦄 😘 💊 🙊 😎 👾 🤷‍♂ 🤷 🤷‍♀ 😡".split()
)
DELETE_LIMIT_S = 48 * 3600  # a bot deletes its messages in groups for 48 hours


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
        self._next_file = 1
        self.files: dict[str, FakeFile] = {}
        self.messages: dict[tuple[str, int], SentMessage] = {}
        self.callbacks: dict[str, dict[str, Any] | None] = {}  # query id -> its answer (None: not yet)
        self.pushed: set[tuple[str, int]] = set()  # (chat id, message id) of the updates given
        self.reactions: dict[tuple[str, int], list[str]] = {}  # the bot's reaction on each message
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
        return self._push_message(
            chat_id,
            user_id,
            {"text": text},
            first_name=first_name,
            last_name=last_name,
            chat_type=chat_type,
            message_id=message_id,
        )

    def push_edit(
        self, chat_id: int, user_id: int, message_id: int, text: str, *, first_name: str = "Ann", caption: bool = False
    ) -> dict[str, Any]:
        """``user_id``'s edit of message ``message_id`` to ``text`` (a file's caption, with
        ``caption``): an ``edited_message`` update, as Telegram sends one."""
        user: dict[str, Any] = {"id": user_id, "is_bot": False, "first_name": first_name}
        now = int(time.time())
        return self.push_update(
            {
                "edited_message": {
                    "message_id": message_id,
                    "date": now - 60,
                    "edit_date": now,
                    "chat": {"id": chat_id, "type": "group", "title": f"chat {chat_id}"},
                    "from": user,
                    "caption" if caption else "text": text,
                }
            }
        )

    def add_file(self, data: bytes, *, folder: str = "documents", ext: str = "bin") -> FakeFile:
        """A file the Bot API holds, as a message carrying it makes one (its path as Telegram
        names them: ``documents/file_3.pdf``, ``photos/file_4.jpg``)."""
        with self._lock:
            n = self._next_file
            self._next_file += 1
        found = FakeFile(f"FILE-{n}", f"U{n}", f"{folder}/file_{n}.{ext}", data, len(data))
        with self._lock:
            self.files[found.file_id] = found
        return found

    def push_document(
        self,
        chat_id: int,
        user_id: int,
        data: bytes,
        *,
        file_name: str | None = "notes.txt",
        caption: str | None = None,
        mime_type: str = "text/plain",
        declared: int | None = -1,
        chat_type: str = "group",
        message_id: int | None = None,
    ) -> tuple[dict[str, Any], FakeFile]:
        """An incoming message with a document (a Document object: file_id, file_unique_id,
        file_name, mime_type, file_size) and its file; ``declared`` is the size the message
        and getFile declare (-1: its true size; None: none)."""
        ext = "".join(c for c in (file_name or "").rpartition(".")[2] if c.isascii() and c.isalnum())[:8]
        held = self.add_file(data, ext=ext or "bin")
        if declared != -1:
            held.file_size = declared
        document: dict[str, Any] = {
            "file_id": held.file_id,
            "file_unique_id": held.file_unique_id,
            "mime_type": mime_type,
        }
        if held.file_size is not None:
            document["file_size"] = held.file_size
        if file_name is not None:
            document["file_name"] = file_name
        fields: dict[str, Any] = {"document": document}
        if caption is not None:
            fields["caption"] = caption
        update = self._push_message(chat_id, user_id, fields, chat_type=chat_type, message_id=message_id)
        return update, held

    def push_photo(
        self,
        chat_id: int,
        user_id: int,
        sizes: list[tuple[int, int, bytes]],
        *,
        caption: str | None = None,
        media_group_id: str | None = None,
        declared: list[int | None] | None = None,
        chat_type: str = "group",
    ) -> tuple[dict[str, Any], list[FakeFile]]:
        """An incoming photo: one PhotoSize (file_id, file_unique_id, width, height,
        file_size) per (width, height, bytes) of ``sizes``, smallest first as Telegram
        lists them; ``declared`` replaces the sizes they declare."""
        held = [self.add_file(data, folder="photos", ext="jpg") for _, _, data in sizes]
        photo = []
        for i, ((width, height, _), f) in enumerate(zip(sizes, held, strict=True)):
            size = f.file_size if declared is None else declared[i]
            f.file_size = size
            entry: dict[str, Any] = {
                "file_id": f.file_id,
                "file_unique_id": f.file_unique_id,
                "width": width,
                "height": height,
            }
            if size is not None:
                entry["file_size"] = size
            photo.append(entry)
        fields: dict[str, Any] = {"photo": photo}
        if caption is not None:
            fields["caption"] = caption
        if media_group_id is not None:
            fields["media_group_id"] = media_group_id
        return self._push_message(chat_id, user_id, fields, chat_type=chat_type), held

    def _push_message(
        self,
        chat_id: int,
        user_id: int,
        fields: dict[str, Any],
        *,
        first_name: str = "Ann",
        last_name: str = "",
        chat_type: str = "group",
        message_id: int | None = None,
    ) -> dict[str, Any]:
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
        with self._lock:
            self.pushed.add((str(chat_id), message_id))
        return self.push_update(
            {"message": {"message_id": message_id, "date": int(time.time()), "chat": chat, "from": user, **fields}}
        )

    def press(self, chat_id: int, message_id: int, user_id: int, data: str, *, first_name: str = "Ann") -> str:
        """A ``callback_query`` update: ``user_id`` pressed the button ``data`` of the bot's
        message ``message_id`` in ``chat_id``; its query id."""
        with self._lock:
            sent = self.messages[(str(chat_id), message_id)]
            query_id = str(9_000_000_000 + len(self.callbacks))
            self.callbacks[query_id] = None
        message = {
            "message_id": message_id,
            "date": int(sent.date),
            "chat": {"id": chat_id, "type": "group", "title": f"chat {chat_id}"},
            "from": self._bot_user(),
            "text": sent.text or "",
        }
        if sent.reply_markup is not None:
            message["reply_markup"] = sent.reply_markup
        self.push_update(
            {
                "callback_query": {
                    "id": query_id,
                    "from": {"id": user_id, "is_bot": False, "first_name": first_name},
                    "message": message,
                    "chat_instance": f"-{chat_id}",
                    "data": data,
                }
            }
        )
        return query_id

    def calls(self, method: str, *, ok_only: bool = False) -> list[Request]:
        with self._lock:
            return [r for r in self.requests if r.method == method and (r.status == 200 or not ok_only)]

    def sent(self) -> list[tuple[str, str]]:
        """(chat_id, text) of every accepted sendMessage, in order."""
        return [(str(r.params["chat_id"]), str(r.params["text"])) for r in self.calls("sendMessage", ok_only=True)]

    def uploads(self) -> list[tuple[str, str, Upload]]:
        """(method, chat_id, file) of every accepted sendPhoto and sendDocument, in order."""
        with self._lock:
            done = [r for r in self.requests if r.method in ("sendPhoto", "sendDocument") and r.status == 200]
        return [(r.method, str(r.params["chat_id"]), r.params[_UPLOAD_FIELD[r.method]]) for r in done]

    def live(self, chat_id: int | str) -> list[SentMessage]:
        """The bot's messages in ``chat_id`` not deleted, in order."""
        with self._lock:
            return [m for m in self.messages.values() if m.chat_id == str(chat_id) and not m.deleted]

    def age(self, chat_id: int | str, message_id: int, seconds: float) -> None:
        """Make a sent message ``seconds`` old (past 48 hours, Telegram keeps it from being deleted)."""
        with self._lock:
            self.messages[(str(chat_id), message_id)].date = time.time() - seconds

    def _keep(self, chat_id: Any, mid: int, kind: str, text: str | None, caption: str | None) -> None:
        with self._lock:
            self.messages[(str(chat_id), mid)] = SentMessage(str(chat_id), mid, kind, text, caption, time.time())

    def downloads(self) -> list[str]:
        """The file paths of every download asked for, in order."""
        return [str(r.params["file_path"]) for r in self.calls("file")]

    # -- lifecycle ---------------------------------------------------------------

    def __enter__(self) -> FakeTelegramAPI:
        # Named "fake-..." and joined on exit: tests/conftest.py fails a run that leaves one running.
        self._thread = threading.Thread(
            target=self.server.serve_forever, args=(0.05,), daemon=True, name="fake-telegram"
        )
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        with self._lock:
            self._lock.notify_all()
        self.server.shutdown()
        self.server.server_close()
        self._thread.join()

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

    def _call(self, method: str, params: dict[str, Any]) -> tuple[int, dict[str, Any]]:  # noqa: C901 - the fake's API: one branch a method
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
        if method == "answerCallbackQuery":
            return self._answer_callback(params)
        if method == "editMessageReplyMarkup":
            return self._edit_markup(params)
        if method == "setMessageReaction":
            return self._react(params)
        if method == "sendMessage":
            text, chat_id = params.get("text"), params.get("chat_id")
            markup = params.get("reply_markup")
            if isinstance(markup, str):
                markup = json.loads(markup)
            problem = _keyboard_problem(markup)
            if problem:
                return 400, {"ok": False, "error_code": 400, "description": f"Bad Request: {problem}"}
            if chat_id in (None, ""):
                return 400, {"ok": False, "error_code": 400, "description": "Bad Request: chat_id is empty"}
            if not text:
                return 400, {"ok": False, "error_code": 400, "description": "Bad Request: message text is empty"}
            if utf16_len(str(text)) > TEXT_LIMIT:
                return 400, {"ok": False, "error_code": 400, "description": "Bad Request: message is too long"}
            with self._lock:
                mid = self._next_message_id
                self._next_message_id += 1
            self._keep(chat_id, mid, "text", str(text), None)
            if markup:
                with self._lock:
                    self.messages[(str(chat_id), mid)].reply_markup = markup
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
        if method == "getFile":
            with self._lock:
                held = self.files.get(str(params.get("file_id") or ""))
            if held is None:
                return 400, {"ok": False, "error_code": 400, "description": "Bad Request: invalid file_id"}
            result: dict[str, Any] = {
                "file_id": held.file_id,
                "file_unique_id": held.file_unique_id,
                "file_path": held.file_path,
            }
            if held.file_size is not None:
                result["file_size"] = held.file_size
            return 200, {"ok": True, "result": result}
        if method in _UPLOAD_FIELD:
            return self._upload(method, params)
        if method in ("editMessageText", "editMessageCaption", "deleteMessage"):
            return self._change(method, params)
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

    def _answer_callback(self, params: dict[str, Any]) -> tuple[int, dict[str, Any]]:
        query_id = str(params.get("callback_query_id") or "")
        text = str(params.get("text") or "")
        with self._lock:
            if query_id not in self.callbacks or self.callbacks[query_id] is not None:
                return 400, {
                    "ok": False,
                    "error_code": 400,
                    "description": "Bad Request: query is too old and response timeout expired or query ID is invalid",
                }
            if len(text) > 200:
                return 400, {"ok": False, "error_code": 400, "description": "Bad Request: MESSAGE_TOO_LONG"}
            alert = params.get("show_alert")
            self.callbacks[query_id] = {"text": text, "show_alert": alert in (True, "true", "True", "1")}
        return 200, {"ok": True, "result": True}

    def _edit_markup(self, params: dict[str, Any]) -> tuple[int, dict[str, Any]]:
        """editMessageReplyMarkup of the bot's own message (no ``reply_markup``: the keyboard off)."""
        chat_id, mid = str(params.get("chat_id") or ""), int(params.get("message_id") or 0)
        markup = params.get("reply_markup")
        markup = json.loads(markup) if isinstance(markup, str) else markup
        problem = _keyboard_problem(markup)
        with self._lock:
            held = self.messages.get((chat_id, mid))
            if problem or held is None or held.deleted:
                why = problem or "message to edit not found"
                return 400, {"ok": False, "error_code": 400, "description": f"Bad Request: {why}"}
            if (held.reply_markup or None) == (markup or None):
                return 400, {"ok": False, "error_code": 400, "description": "Bad Request: message is not modified"}
            held.reply_markup = markup or None
            held.edits += 1
            doc = {"message_id": mid, "date": int(held.date), "chat": {"id": int(chat_id), "type": "group"}}
        return 200, {"ok": True, "result": {**doc, "text": held.text or "", "from": self._bot_user()}}

    def _upload(self, method: str, params: dict[str, Any]) -> tuple[int, dict[str, Any]]:
        """sendPhoto / sendDocument: the file must come as a multipart part (an upload)."""
        chat_id, part = params.get("chat_id"), params.get(_UPLOAD_FIELD[method])
        if chat_id in (None, ""):
            return 400, {"ok": False, "error_code": 400, "description": "Bad Request: chat_id is empty"}
        if not isinstance(part, Upload):
            return 400, {"ok": False, "error_code": 400, "description": "Bad Request: there is no file in the request"}
        if method == "sendPhoto" and len(part.data) > PHOTO_MAX_BYTES:
            return 400, {"ok": False, "error_code": 400, "description": "Bad Request: PHOTO_SAVE_FILE_INVALID"}
        with self._lock:
            mid = self._next_message_id
            self._next_message_id += 1
        held = self.add_file(part.data, folder="photos" if method == "sendPhoto" else "documents")
        self._keep(chat_id, mid, "photo" if method == "sendPhoto" else "document", None, params.get("caption"))
        if method == "sendPhoto":
            media: dict[str, Any] = {
                "photo": [
                    {
                        "file_id": held.file_id,
                        "file_unique_id": held.file_unique_id,
                        "width": 1,
                        "height": 1,
                        "file_size": len(part.data),
                    }
                ]
            }
        else:
            media = {
                "document": {
                    "file_id": held.file_id,
                    "file_unique_id": held.file_unique_id,
                    "file_name": part.filename,
                    "mime_type": part.content_type,
                    "file_size": len(part.data),
                }
            }
        chat = {"id": int(chat_id), "type": "group", "title": "chat"}
        return 200, {
            "ok": True,
            "result": {"message_id": mid, "date": int(time.time()), "chat": chat, "from": self._bot_user(), **media},
        }

    def _react(self, params: dict[str, Any]) -> tuple[int, dict[str, Any]]:
        """setMessageReaction: ``reaction`` a JSON list of ``{"type": "emoji", "emoji": ...}``."""

        def bad(description: str) -> tuple[int, dict[str, Any]]:
            return 400, {"ok": False, "error_code": 400, "description": f"Bad Request: {description}"}

        try:
            key = (str(params.get("chat_id")), int(params.get("message_id") or 0))
            reaction = params.get("reaction") or "[]"
            reaction = json.loads(reaction) if isinstance(reaction, str) else reaction
            emoji = [r["emoji"] for r in reaction if r.get("type") == "emoji"]
        except (ValueError, TypeError, KeyError):
            return bad("message identifier is not specified")
        if len(emoji) > 1:
            return bad("REACTIONS_TOO_MANY")
        if any(e not in BOT_REACTIONS for e in emoji):
            return bad("REACTION_INVALID")
        with self._lock:
            sent = self.messages.get(key)
            if key not in self.pushed and (sent is None or sent.deleted):
                return bad("message to react not found")
            self.reactions[key] = emoji
        return 200, {"ok": True, "result": True}

    def _change(self, method: str, params: dict[str, Any]) -> tuple[int, dict[str, Any]]:
        """editMessageText, editMessageCaption, deleteMessage of a message the bot sent."""

        def bad(description: str) -> tuple[int, dict[str, Any]]:
            return 400, {"ok": False, "error_code": 400, "description": f"Bad Request: {description}"}

        try:
            key = (str(params.get("chat_id")), int(params.get("message_id") or 0))
        except ValueError:
            return bad("message identifier is not specified")
        with self._lock:
            found = self.messages.get(key)
            if found is None or found.deleted:
                return bad("message to delete not found" if method == "deleteMessage" else "message to edit not found")
            if method == "deleteMessage":
                if time.time() - found.date > DELETE_LIMIT_S:
                    return bad("message can't be deleted for everyone")
                found.deleted = True
                return 200, {"ok": True, "result": True}
            new = str(params.get("text" if method == "editMessageText" else "caption") or "")
            if method == "editMessageText":
                if found.kind != "text":
                    return bad("there is no text in the message to edit")
                if not new:
                    return bad("message text is empty")
                if utf16_len(new) > TEXT_LIMIT:
                    return bad("MESSAGE_TOO_LONG")
                old, found.text = found.text, new
            else:
                if found.kind == "text":
                    return bad("there is no caption in the message to edit")
                old, found.caption = found.caption, new
            if old == new:
                return bad(
                    "message is not modified: specified new message content and reply markup are exactly "
                    "the same as a current content and reply markup of the message"
                )
            found.edits += 1
            result: dict[str, Any] = {
                "message_id": found.message_id,
                "date": int(found.date),
                "edit_date": int(time.time()),
                "chat": {"id": int(found.chat_id), "type": "group", "title": "chat"},
                "from": self._bot_user(),
            }
            if found.kind == "text":
                result["text"] = found.text
            else:
                result["caption"] = found.caption
                result["document"] = {"file_id": "FILE-x", "file_unique_id": "Ux"}
            return 200, {"ok": True, "result": result}

    def _download(self, handler: BaseHTTPRequestHandler, token_and_path: str) -> None:
        """``GET /file/bot<token>/<file_path>``: the bytes of the file getFile named there."""
        prefix, _, path = token_and_path.partition("/")
        path = unquote(path)
        with self._lock:
            held = next((f for f in self.files.values() if f.file_path == path), None)
        status = 200 if prefix == f"bot{self.token}" and held is not None else 404
        with self._lock:
            self.requests.append(Request("file", handler.command, {"file_path": path}, status))
        if held is None or status != 200:
            data = b"Not Found"
            handler.send_response(404)
            handler.send_header("content-length", str(len(data)))
            handler.end_headers()
            handler.wfile.write(data)
            return
        if held.on_download is not None:
            held.on_download()
        handler.send_response(200)
        handler.send_header("content-type", "application/octet-stream")
        if held.content_encoding:
            handler.send_header("content-encoding", held.content_encoding)
        handler.send_header("content-length", str(len(held.data)))
        handler.end_headers()
        try:
            for start in range(0, len(held.data), DOWNLOAD_CHUNK):
                handler.wfile.write(held.data[start : start + DOWNLOAD_CHUNK])
                handler.wfile.flush()
                if held.delay_s:
                    time.sleep(held.delay_s)
        except OSError:
            handler.close_connection = True  # the client went away (a timeout): nothing more to send

    def _handler(self) -> type[BaseHTTPRequestHandler]:
        fake = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def _serve(self) -> None:
                url = urlsplit(self.path)
                body = self.rfile.read(int(self.headers.get("content-length") or 0))
                if url.path.startswith("/file/"):
                    fake._download(self, url.path[len("/file/") :])
                    return
                params: dict[str, Any] = dict(parse_qsl(url.query))
                ctype = (self.headers.get("content-type") or "").split(";")[0].strip()
                if body and ctype == "application/json":
                    params.update(json.loads(body))
                elif body and ctype == "application/x-www-form-urlencoded":
                    params.update(parse_qsl(body.decode()))
                elif body and ctype == "multipart/form-data":
                    params.update(_multipart(body, self.headers.get("content-type") or ""))
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


_UPLOAD_FIELD = {"sendPhoto": "photo", "sendDocument": "document"}


def _keyboard_problem(markup: Any) -> str | None:
    """Why Telegram would refuse ``markup`` as an inline keyboard (None: it would not)."""
    if markup is None:
        return None
    rows = markup.get("inline_keyboard") if isinstance(markup, dict) else None
    if not isinstance(rows, list) or not all(isinstance(row, list) for row in rows):
        return "can't parse reply keyboard markup JSON object"
    for button in (b for row in rows for b in row):
        if not isinstance(button, dict) or not button.get("text"):
            return "BUTTON_TEXT_EMPTY"
        data = button.get("callback_data")
        if data is not None and not 1 <= len(str(data).encode()) <= 64:
            return "BUTTON_DATA_INVALID"
    return None


def _multipart(body: bytes, content_type: str) -> dict[str, Any]:
    """The fields of a multipart/form-data body: a part with a filename as an :class:`Upload`,
    any other as its text."""
    _, options = parse_options_header(content_type)
    parts: list[tuple[dict[bytes, bytes], bytearray]] = []
    header = [b"", b""]

    def on_part_begin() -> None:
        parts.append(({}, bytearray()))

    def on_header_field(data: bytes, start: int, end: int) -> None:
        header[0] += data[start:end]

    def on_header_value(data: bytes, start: int, end: int) -> None:
        header[1] += data[start:end]

    def on_header_end() -> None:
        parts[-1][0][header[0].strip().lower()] = header[1]
        header[0], header[1] = b"", b""

    def on_part_data(data: bytes, start: int, end: int) -> None:
        parts[-1][1].extend(data[start:end])

    parser = MultipartParser(
        options[b"boundary"],
        {
            "on_part_begin": on_part_begin,
            "on_header_field": on_header_field,
            "on_header_value": on_header_value,
            "on_header_end": on_header_end,
            "on_part_data": on_part_data,
        },
    )
    parser.write(body)
    parser.finalize()
    fields: dict[str, Any] = {}
    for headers, data in parts:
        _, disposition = parse_options_header(headers.get(b"content-disposition", b""))
        name = disposition[b"name"].decode()
        if b"filename" in disposition:
            ctype = headers.get(b"content-type", b"application/octet-stream").decode()
            fields[name] = Upload(disposition[b"filename"].decode(), ctype, bytes(data))
        else:
            fields[name] = bytes(data).decode()
    return fields
