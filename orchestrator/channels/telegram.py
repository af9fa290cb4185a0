"""Telegram: a chat platform as an optional channel (``pip install '.[telegram]'``).

* **Outbound**: the ``telegram`` channel sends each delivered message with
  the Bot API's ``sendMessage`` to the attachment's address, a Telegram chat
  id (``orchestrator groups attach JID telegram --address -1001234567890``;
  ``@channelname`` works for public channels).  Text longer than 4096
  characters (UTF-16 units, as Telegram counts) goes as several messages,
  cut at a line break where one is near.  A failed call (an error answer,
  a network error) raises :class:`~orchestrator.core.errors.ChannelError`,
  so the deliveries table retries it (flood control, 429, raises
  :class:`~orchestrator.core.errors.ChannelRateLimited`: retried after its
  ``retry_after``, no attempt counted).  A message that carries files (a FILE
  envelope) is its words, then each file with ``sendPhoto`` or ``sendDocument``
  (``channels/telegram_files.py``).  The parts of a long message and the files
  already sent are not sent again by a retry in the same process.
* **People's edits**: an ``edited_message`` update by the message's own sender edits
  the stored message (``channels/telegram_edits.py``); it reruns nothing.
* **Changes**: an edited message edited in place, a superseded one deleted (or,
  past Telegram's 48 hours, edited to a "retracted" line), by the message ids
  ``send`` returned (``channels/telegram_changes.py``).
* **Inbound**: ``TelegramPoller`` long-polls ``getUpdates`` (``orchestrator telegram
  poll``) and ingests each text message, document and photo
  (``channels/telegram_poller.py``).
* **Questions**: the agent's question goes with an inline keyboard, and a press on
  one of its buttons (a ``callback_query`` update) answers it
  (``channels/telegram_questions.py``).

Enable it with ``ORCHESTRATOR_CHANNEL_PLUGINS=orchestrator.channels.telegram:channel``
and ``ORCHESTRATOR_TELEGRAM_BOT_TOKEN``.  python-telegram-bot is asynchronous; the
channel and the poller call it through ``TelegramClient`` (``channels/telegram_client.py``),
which runs it on a private event loop in a daemon thread.
"""

from __future__ import annotations

import re
import threading
from collections.abc import Callable
from typing import Any, TypeVar

from agent_runner.protocol import Reaction
from orchestrator.channels.base import FILE_POST, BaseChannel, post_named
from orchestrator.channels.telegram_changes import TelegramChanges
from orchestrator.channels.telegram_client import TelegramClient, channel_error
from orchestrator.channels.telegram_files import upload
from orchestrator.channels.telegram_questions import question_keyboard
from orchestrator.core.errors import ChannelError, NotFound
from orchestrator.core.settings import Settings
from orchestrator.model.envelopes import FileRef, files_of
from orchestrator.model.render import RenderedMessage
from orchestrator.store.db import Database, open_database
from orchestrator.store.files import FileStore

CHANNEL = "telegram"
TEXT_LIMIT = 4096
_ADDRESS = re.compile(r"^(-?\d{1,20}|@[A-Za-z][A-Za-z0-9_]{3,31})$")

T = TypeVar("T")


def _units(text: str) -> int:
    """Telegram's length of ``text``: UTF-16 code units."""
    return len(text.encode("utf-16-le", "surrogatepass")) // 2


def _fit(text: str, start: int, limit: int) -> int:
    """The end of the longest piece ``text[start:end]`` of at most ``limit`` units.

    Starts from ``limit`` characters and drops half the excess (in
    characters) each round: fewer could not be enough (a character is at
    most 2 units), so the answer is never passed, and the excess at least
    halves: O(limit · log limit) per piece, linear in the text overall.
    """
    end = min(len(text), start + limit)
    while (excess := _units(text[start:end]) - limit) > 0:
        end -= (excess + 1) // 2
    return max(end, start + 1)  # a lone 2-unit character with limit 1: send it anyway


def split_text(text: str, limit: int = TEXT_LIMIT) -> list[str]:
    """``text`` in parts of at most ``limit`` UTF-16 units, cut after a line
    break in the second half of a part when there is one.

    Linear in the text: each piece is measured and searched once, by index
    (no copies of the rest of the text; a 10 MB reply must not hold a
    delivery slot for minutes).
    """
    parts: list[str] = []
    start = 0
    while start < len(text):
        end = _fit(text, start, limit)
        if end < len(text):
            newline = text.rfind("\n", start, end)
            if newline != -1 and newline - start >= (end - start) // 2:
                end = newline + 1
        parts.append(text[start:end])
        start = end
    return parts


class TelegramChannel(BaseChannel):
    """Sends each delivered message to a Telegram chat (the attachment's address: its chat id),
    its words first, then each file it carries (``channels/telegram_files.py``)."""

    name = CHANNEL

    def __init__(self, settings: Settings, client: TelegramClient | None = None, db: Database | None = None) -> None:
        self.settings = settings
        self.client = client or TelegramClient(settings.telegram)
        self._db = db
        self._own_db = db is None
        # Steps of a message already sent (its text's parts, then its files: each one's
        # message id), by (address, chat, seq): a retry resumes after them.
        self._progress: dict[tuple[str, str, int], list[str]] = {}
        self._progress_lock = threading.Lock()
        self._changes = TelegramChanges(self.client, self._send_text)

    @property
    def db(self) -> Database:
        # Made on first use, by the first message with files: a process that only builds the
        # registry (the CLI), or sends only words, never opens it.
        with self._progress_lock:
            if self._db is None:
                self._db = open_database(self.settings, migrate=False)
            return self._db

    def owns(self, address: str) -> bool:
        return bool(_ADDRESS.match(address.strip()))

    def send(self, address: str, rendered: RenderedMessage) -> list[str]:
        """Send ``rendered``; the message id of each part of its words, then ``file:<id>`` of
        each message that carries one of its files."""
        address = address.strip()
        if not self.owns(address):
            raise ChannelError(f"the telegram channel needs a chat id as its address, not {address!r}")
        target: int | str = int(address) if address.lstrip("-").isdigit() else address
        parts = split_text(rendered.text)
        files = files_of(rendered.metadata)
        refs = files.files if files is not None else []
        keyboard = question_keyboard(rendered.metadata)  # a question's buttons, under its last part
        key = (address, rendered.chat_jid, rendered.seq)
        with self._progress_lock:
            made = list(self._progress.get(key, []))
        from telegram.error import TelegramError

        for i in range(len(made), len(parts) + len(refs)):
            try:
                if i < len(parts):
                    made.append(str(self._send_text(target, parts[i], keyboard if i == len(parts) - 1 else None)))
                else:
                    made.append(FILE_POST + str(self._send_file(target, rendered.chat_jid, refs[i - len(parts)])))
            except ChannelError:
                raise
            except (TelegramError, Exception) as exc:  # any failure is a failed send, retried
                raise channel_error(address, exc) from exc
            with self._progress_lock:
                self._progress[key] = list(made)
        with self._progress_lock:
            self._progress.pop(key, None)
        return made

    def edit(self, address: str, posted: list[str], rendered: RenderedMessage) -> list[str]:
        """``editMessageText`` of each part in place (``orchestrator/channels/telegram_changes.py``)."""
        target = self._target(address)
        return self._changing(address, lambda: self._changes.edit(target, posted, split_text(rendered.text), rendered))

    def retract(self, address: str, posted: list[str], rendered: RenderedMessage) -> None:
        """``deleteMessage`` of each message, or past 48 hours an edit to "retracted"."""
        target = self._target(address)
        self._changing(address, lambda: self._changes.retract(target, posted))

    def react(self, address: str, posted: list[str], rendered: RenderedMessage, reaction: Reaction) -> bool:
        """``setMessageReaction`` with Telegram's form of the emoji (False: not in its set)."""
        target = self._target(address)
        return self._changing(address, lambda: self._changes.react(target, posted, reaction.telegram))

    def origin_post(self, address: str, message_id: str) -> str | None:
        """The message id of a message that came from chat ``address`` (``tg-<chat id>-<message id>``)."""
        return post_named(message_id, f"tg-{address.strip()}-")

    def _target(self, address: str) -> int | str:
        address = address.strip()
        if not self.owns(address):
            raise ChannelError(f"the telegram channel needs a chat id as its address, not {address!r}")
        return int(address) if address.lstrip("-").isdigit() else address

    def _changing(self, address: str, change: Callable[[], T]) -> T:
        """``change``, its failures made the deliverer's: ChannelError, or ChannelRateLimited."""
        try:
            return change()
        except ChannelError:
            raise
        except Exception as exc:  # any failure is a failed change, retried
            raise channel_error(address.strip(), exc) from exc

    def _send_text(self, target: int | str, text: str, keyboard: Any = None) -> int:
        """One message of words (with ``keyboard``, an inline keyboard, under it); its message id."""
        sent = self.client.call(lambda bot: bot.send_message(chat_id=target, text=text, reply_markup=keyboard))
        return int(sent.message_id)

    def _send_file(self, target: int | str, chat_jid: str, ref: FileRef) -> int:
        """One file of ``chat_jid``'s message; the id of the message that carries it (or says it is gone)."""
        store = FileStore.from_settings(self.db, self.settings)
        try:
            # The message's own chat's file only (ingest made sure it names no other).
            stored = store.get(ref.id, chat_jid=chat_jid)
        except NotFound:
            # Freed since (its messages removed): no retry brings it back; the chat is told.
            return self._send_text(target, f"📎 {ref.name}: no longer stored")
        return upload(self.client, store, target, stored)

    def disconnect(self) -> None:
        self.client.close()
        with self._progress_lock:
            db, self._db = (self._db, None) if self._own_db else (None, self._db)
        if db is not None:
            db.engine.dispose()


def channel(settings: Settings) -> TelegramChannel:
    """The ``ORCHESTRATOR_CHANNEL_PLUGINS`` factory: ``orchestrator.channels.telegram:channel``."""
    return TelegramChannel(settings)
