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
* **Inbound**: :class:`TelegramPoller` long-polls ``getUpdates`` (``orchestrator
  telegram poll``) and ingests each text message with ``channel="telegram"``
  (mirrored to the group's other channels, not back), and each document or
  photo with its caption as the words and its file fetched into the file store
  (``channels/telegram_files.py``: only for a registered group, within
  ``ORCHESTRATOR_FILE_MAX_BYTES`` and ``ORCHESTRATOR_TELEGRAM_FILE_TIMEOUT_S``;
  a file not taken leaves a line in the words saying why).  The chat is the group
  whose ``telegram`` attachment address is the Telegram chat id; a chat no
  group is attached to is stored under ``tg:<chat id>`` and never wakes an
  agent, like any unregistered chat, within ingest's bounds on them (how many such
  chats are kept, and each one's newest messages: ``ORCHESTRATOR_UNREGISTERED_CHATS``,
  ``ORCHESTRATOR_UNREGISTERED_CHAT_MESSAGES``); a message past them is dropped
  (counted and logged by ingest) and polling goes on.  The next offset is kept in
  ``<data dir>/telegram/offset-<bot>`` after each batch is stored, and message
  ids are ``tg-<chat id>-<message id>``, so a restart (or a redelivered
  update) stores nothing twice.  A sender over
  ``ORCHESTRATOR_SENDER_MESSAGES_PER_MINUTE`` gets a reply ("slow down: try
  again in N s", once per wait) and the message is dropped, not stored.
* **Questions**: the agent's question goes with an inline keyboard, and a press on
  one of its buttons (a ``callback_query`` update) answers it
  (``channels/telegram_questions.py``).

Enable it with ``ORCHESTRATOR_CHANNEL_PLUGINS=orchestrator.channels.telegram:channel``
and ``ORCHESTRATOR_TELEGRAM_BOT_TOKEN``.  python-telegram-bot is asynchronous;
the channel runs it on a private event loop in a daemon thread (one per
process, made again after a fork), so the synchronous deliverer can call it
from any thread.
"""

from __future__ import annotations

import asyncio
import hashlib
import logging
import os
import re
import threading
import time
import warnings
from collections.abc import Callable, Coroutine
from datetime import timedelta
from typing import Any, TypeVar

from agent_runner.protocol import Reaction
from orchestrator.channels.base import FILE_POST, BaseChannel, post_named
from orchestrator.channels.telegram_changes import TelegramChanges
from orchestrator.channels.telegram_edits import sender_of, take_telegram_edit
from orchestrator.channels.telegram_files import (
    Attachment,
    FileFetcher,
    attachment_of,
    not_taken,
    too_large_reason,
    upload,
)
from orchestrator.channels.telegram_questions import question_keyboard, take_callback
from orchestrator.core.errors import (
    ChannelError,
    ChannelRateLimited,
    FileTooLarge,
    MessageNotFound,
    NotFound,
    RateLimited,
    UnregisteredChatsFull,
)
from orchestrator.core.settings import Settings
from orchestrator.model.envelopes import FileRef, files_of
from orchestrator.model.render import RenderedMessage
from orchestrator.run.ingest import IncomingMessage, IngestResult, ingest
from orchestrator.store.attachments import chats_on
from orchestrator.store.db import Database, open_database
from orchestrator.store.files import FileStore, StoredFile, file_envelope
from orchestrator.store.groups import registered_chats
from orchestrator.store.message_log import resolve_message
from orchestrator.store.usage import sender_retry_after

log = logging.getLogger(__name__)

CHANNEL = "telegram"
TEXT_LIMIT = 4096
UNATTACHED_PREFIX = "tg:"
_ADDRESS = re.compile(r"^(-?\d{1,20}|@[A-Za-z][A-Za-z0-9_]{3,31})$")
_CALL_TIMEOUT_S = 30.0

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


def _require_ptb() -> Any:
    try:
        import telegram
    except ImportError as exc:  # the optional extra is not installed
        raise ChannelError(
            "the telegram channel needs python-telegram-bot: pip install 'agent-orchestrator[telegram]'"
        ) from exc
    return telegram


class TelegramClient:
    """One ``telegram.Bot`` on a private event loop in a daemon thread.

    :meth:`call` runs a coroutine factory (given the initialized bot) there and
    waits for it.  After a fork (prefork workers) the loop is made again.
    """

    def __init__(self, settings: Settings) -> None:
        if not settings.telegram_bot_token:
            raise ChannelError("set ORCHESTRATOR_TELEGRAM_BOT_TOKEN to use the telegram channel")
        _require_ptb()
        self._token = settings.telegram_bot_token
        self._base = settings.telegram_api_base.rstrip("/")
        self._lock = threading.Lock()
        self._pid: int | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self._bot: Any = None

    def file_url(self, file_path: str) -> str:
        """The Bot API's download URL of ``file_path`` (a checked ``getFile`` path) on the
        configured API: ``<api base>/file/bot<token>/<file_path>``.  It holds the token:
        never logged, never shown."""
        return f"{self._base}/file/bot{self._token}/{file_path}"

    @property
    def bot_key(self) -> str:
        """A short stable name of the bot (for the offset file), not the token."""
        return hashlib.sha256(self._token.encode()).hexdigest()[:12]

    def _make_bot(self) -> Any:
        from telegram import Bot
        from telegram.request import HTTPXRequest

        return Bot(
            self._token,
            base_url=f"{self._base}/bot",
            base_file_url=f"{self._base}/file/bot",
            request=HTTPXRequest(connection_pool_size=8, connect_timeout=10, read_timeout=20, write_timeout=20),
            get_updates_request=HTTPXRequest(connection_pool_size=1, connect_timeout=10, read_timeout=10),
        )

    def _ensure_loop(self) -> asyncio.AbstractEventLoop:
        with self._lock:
            if self._loop is None or self._pid != os.getpid():
                loop = asyncio.new_event_loop()
                thread = threading.Thread(target=loop.run_forever, daemon=True, name="telegram-loop")
                thread.start()
                self._loop, self._thread, self._pid, self._bot = loop, thread, os.getpid(), None
            return self._loop

    def call(self, make: Callable[[Any], Coroutine[Any, Any, T]], timeout: float = _CALL_TIMEOUT_S) -> T:
        loop = self._ensure_loop()

        async def run() -> T:
            if self._bot is None:
                bot = self._make_bot()
                await bot.initialize()  # getMe: a wrong token fails here
                self._bot = bot
            return await make(self._bot)

        future = asyncio.run_coroutine_threadsafe(run(), loop)
        try:
            return future.result(timeout)
        except TimeoutError as exc:
            future.cancel()
            raise ChannelError(f"telegram: no answer within {timeout:.0f}s") from exc

    def close(self) -> None:
        with self._lock:
            loop, thread, bot = self._loop, self._thread, self._bot
            self._loop = self._thread = self._bot = None
        if loop is None or self._pid != os.getpid():
            return
        if bot is not None:
            try:
                asyncio.run_coroutine_threadsafe(bot.shutdown(), loop).result(10)
            except Exception:  # noqa: BLE001 - stopping the loop matters more
                log.exception("the telegram bot did not shut down cleanly")
        loop.call_soon_threadsafe(loop.stop)
        if thread is not None:
            thread.join(10)
        if not loop.is_running():
            loop.close()


def _channel_error(address: str, exc: Exception) -> ChannelError:
    from telegram.error import RetryAfter

    if isinstance(exc, RetryAfter):
        # Telegram's flood control says when it takes sends again: the deliverer waits that
        # long and counts no attempt (ChannelRateLimited).  The attribute is an int or a
        # timedelta by the library's version and settings, and warns while that changes.
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            wait = exc.retry_after
        seconds = wait.total_seconds() if isinstance(wait, timedelta) else float(wait)
        return ChannelRateLimited(f"telegram {address}: rate limited ({exc})", seconds)
    return ChannelError(f"telegram {address}: {type(exc).__name__}: {exc}")


class TelegramChannel(BaseChannel):
    """Sends each delivered message to a Telegram chat (the attachment's address: its chat id),
    its words first, then each file it carries (``channels/telegram_files.py``)."""

    name = CHANNEL

    def __init__(self, settings: Settings, client: TelegramClient | None = None, db: Database | None = None) -> None:
        self.settings = settings
        self.client = client or TelegramClient(settings)
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
            except (TelegramError, Exception) as exc:  # noqa: BLE001 - any failure is a failed send, retried
                raise _channel_error(address, exc) from exc
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
        except Exception as exc:  # noqa: BLE001 - any failure is a failed change, retried
            raise _channel_error(address.strip(), exc) from exc

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


# -- inbound ------------------------------------------------------------------------------


def attached_groups(db: Database) -> dict[str, str]:
    """Telegram chat id -> the group attached to it (the first by chat id when several are)."""
    found: dict[str, str] = {}
    for chat_jid, address in chats_on(db, CHANNEL):
        found.setdefault((address or chat_jid).strip(), chat_jid)
    return found


class TelegramPoller:
    """Long-polls ``getUpdates`` and ingests each text message, and each document or photo
    with its file (see the module's docs)."""

    def __init__(
        self,
        db: Database,
        settings: Settings,
        *,
        signal: Callable[[str], object] | None = None,
        signal_delivery: Callable[[str], object] | None = None,
        client: TelegramClient | None = None,
    ) -> None:
        self.db, self.settings = db, settings
        self.signal, self.signal_delivery = signal, signal_delivery
        self._own_client = client is None
        self.client = client or TelegramClient(settings)
        self.files = FileFetcher(settings, FileStore.from_settings(db, settings), self.client)
        self.offset_path = settings.data_dir / CHANNEL / f"offset-{self.client.bot_key}"
        self.offset = self._read_offset()
        # (chat, sender) -> monotonic time until which a rate-limited sender was told to wait.
        self._told: dict[tuple[str, str], float] = {}

    def _read_offset(self) -> int | None:
        try:
            return int(self.offset_path.read_text().strip())
        except (OSError, ValueError):
            return None

    def _write_offset(self, offset: int) -> None:
        self.offset_path.parent.mkdir(parents=True, exist_ok=True)
        tmp = self.offset_path.with_suffix(".tmp")
        tmp.write_text(f"{offset}\n")
        os.replace(tmp, self.offset_path)
        self.offset = offset

    def poll_once(self, timeout: int = 0) -> list[IngestResult]:
        """One ``getUpdates`` (waiting up to ``timeout`` seconds); what it stored."""
        from telegram.error import TelegramError

        offset = self.offset
        try:
            updates = self.client.call(
                lambda bot: bot.get_updates(
                    offset=offset, timeout=timeout, allowed_updates=["message", "callback_query", "edited_message"]
                ),
                timeout=timeout + _CALL_TIMEOUT_S,
            )
        except ChannelError:
            raise
        except (TelegramError, Exception) as exc:  # noqa: BLE001 - the poller logs it and polls again
            raise _channel_error("getUpdates", exc) from exc
        if not updates:
            return []
        groups = attached_groups(self.db)
        taken = [(u, incoming) for u in updates if (incoming := self._incoming(u, groups)) is not None]
        # Files are fetched for registered groups only: asked once for the batch, before any request.
        with_files = {incoming.chat_jid for u, incoming in taken if self._attachment(u.message) is not None}
        registered = registered_chats(self.db, with_files)
        results = []
        for update, incoming in taken:
            attachment = self._attachment(update.message)
            fetched: StoredFile | None = None
            if attachment is not None:
                incoming, fetched = self._with_file(incoming, attachment, registered=incoming.chat_jid in registered)
            try:
                result = ingest(
                    self.db, self.settings, incoming, signal=self.signal, signal_delivery=self.signal_delivery
                )
            except RateLimited as exc:
                self._unused(fetched)
                self._slow_down(update.message, incoming, exc)
                continue
            except UnregisteredChatsFull:
                self._unused(fetched)
                continue  # an unattached chat past the cap: dropped (ingest counted and logged it)
            except BaseException:
                self._unused(fetched)
                raise
            if not result.created:
                self._unused(fetched)  # stored meanwhile (a redelivery raced in): its first copy stands
            results.append(result)
        for update in updates:  # a press on a question's button (telegram_questions.py)
            if update.callback_query is not None:
                take_callback(
                    self.db,
                    self.client,
                    update.callback_query,
                    groups,
                    signal=self.signal,
                    signal_delivery=self.signal_delivery,
                )
        for update in updates:  # a person's edit of their message (telegram_edits.py)
            if update.edited_message is not None:
                edited = update.edited_message
                chat_id = str(edited.chat.id)
                take_telegram_edit(
                    self.db,
                    self.settings,
                    edited,
                    groups.get(chat_id, f"{UNATTACHED_PREFIX}{chat_id}"),
                    channel=CHANNEL,
                    signal_delivery=self.signal_delivery,
                )
        # Only after the batch is stored: a crash before this re-reads it, and the ids dedupe it.
        self._write_offset(max(u.update_id for u in updates) + 1)
        return results

    def _attachment(self, msg: Any) -> Attachment | None:
        return attachment_of(msg, self.settings.file_max_bytes)

    def _with_file(
        self, incoming: IncomingMessage, attachment: Attachment, *, registered: bool
    ) -> tuple[IncomingMessage, StoredFile | None]:
        """``incoming`` with its file stored and named in a FILE envelope (and the stored
        file), or with a line in its words saying why the file was not taken.  Nothing is
        asked of Telegram for a chat that is no registered group, nor for a message already
        stored (a redelivered update: ingest answers it as the duplicate it is), nor for a
        sender over its rate (ingest refuses the message)."""
        if not registered:
            return _noted(incoming, not_taken(attachment.name, "this chat is no registered group")), None
        if self._stored_already(incoming) or self._over_rate(incoming):
            return incoming, None
        try:
            stored = self.files.fetch(incoming.chat_jid, attachment)
        except FileTooLarge as exc:
            return _noted(incoming, not_taken(attachment.name, too_large_reason(exc))), None
        except ChannelError as exc:
            log.warning("telegram: the file of %s was not taken: %s", incoming.id, exc)
            return _noted(incoming, not_taken(attachment.name, str(exc))), None
        return incoming.model_copy(update={"metadata": file_envelope([stored])}), stored

    def _unused(self, fetched: StoredFile | None) -> None:
        """Take back a file its message was not stored with: no message would ever name it,
        and it would count against its group's limit."""
        if fetched is not None:
            self.files.store.discard([fetched])

    def _stored_already(self, incoming: IncomingMessage) -> bool:
        assert incoming.id is not None  # the poller names every message it takes
        try:
            resolve_message(incoming.chat_jid, incoming.id, db=self.db)
        except MessageNotFound:
            return False
        return True

    def _over_rate(self, incoming: IncomingMessage) -> bool:
        """Whether ingest would refuse ``incoming``'s sender for its rate now (read, not counted)."""
        limit = self.settings.sender_messages_per_minute
        if not limit:
            return False
        assert incoming.id is not None
        with self.db.engine.begin() as conn:
            wait = sender_retry_after(
                conn, self.db, chat_jid=incoming.chat_jid, sender=incoming.sender, message_id=incoming.id, limit=limit
            )
        return wait is not None

    def _slow_down(self, msg: Any, incoming: IncomingMessage, exc: RateLimited) -> None:
        """A sender over its rate: the message is dropped, not stored; the sender is told
        (in reply to it), once per wait, so a flood does not become a flood of replies."""
        key = (incoming.chat_jid, incoming.sender)
        now = time.monotonic()
        log.info(
            "telegram: %s in %s is over the rate limit; message %s not stored (retry in %d s)",
            incoming.sender,
            incoming.chat_jid,
            incoming.id,
            exc.retry_after_s,
        )
        if self._told.get(key, 0.0) > now:
            return
        self._told = {k: until for k, until in self._told.items() if until > now}
        self._told[key] = now + exc.retry_after_s
        text = f"⏳ slow down: try again in {exc.retry_after_s} s (this message was not taken)"

        def reply(bot: Any) -> Any:
            from telegram import ReplyParameters

            return bot.send_message(
                chat_id=msg.chat.id,
                text=text,
                reply_parameters=ReplyParameters(message_id=msg.message_id, allow_sending_without_reply=True),
            )

        try:
            self.client.call(reply)
        except Exception as err:  # noqa: BLE001 - telling the sender is a courtesy; polling goes on
            log.warning("telegram: could not tell %s to slow down: %s", incoming.sender, err)

    @staticmethod
    def _incoming(update: Any, groups: dict[str, str]) -> IncomingMessage | None:
        msg = update.message
        if msg is None or not (msg.text or msg.document or msg.photo):
            return None  # text, documents and photos only (joins, stickers, videos, ... are skipped)
        chat_id = str(msg.chat.id)
        sender, name = sender_of(msg)
        return IncomingMessage(
            chat_jid=groups.get(chat_id, f"{UNATTACHED_PREFIX}{chat_id}"),
            sender=sender,
            sender_name=name,
            content=msg.text or msg.caption or "",  # a file's caption is its message's words
            id=f"tg-{chat_id}-{msg.message_id}",
            timestamp=msg.date.isoformat() if msg.date else None,
            channel=CHANNEL,
        )

    def run(self, stop: threading.Event | None = None, *, timeout: int = 30, error_pause_s: float = 5.0) -> None:
        """Poll until ``stop`` is set; an error is logged and polling goes on after a pause."""
        stop = stop or threading.Event()
        while not stop.is_set():
            try:
                stored = self.poll_once(timeout)
                if stored:
                    log.info("telegram: stored %d message(s)", sum(r.created for r in stored))
            except ChannelError as exc:
                log.warning("%s; polling again in %.0fs", exc, error_pause_s)
                stop.wait(error_pause_s)

    def close(self) -> None:
        self.files.close()
        if self._own_client:
            self.client.close()


def _noted(incoming: IncomingMessage, line: str) -> IncomingMessage:
    """``incoming`` with ``line`` under its words."""
    content = f"{incoming.content}\n{line}" if incoming.content else line
    return incoming.model_copy(update={"content": content})


def poll_forever(
    db: Database,
    settings: Settings,
    *,
    once: bool = False,
    timeout: int = 30,
    signal: Callable[[str], object] | None = None,
    signal_delivery: Callable[[str], object] | None = None,
) -> int:
    """What ``orchestrator telegram poll`` runs; returns how many messages it stored."""
    poller = TelegramPoller(db, settings, signal=signal, signal_delivery=signal_delivery)
    try:
        if once:
            return sum(r.created for r in poller.poll_once(timeout))
        poller.run(timeout=timeout)
        return 0
    finally:
        poller.close()
