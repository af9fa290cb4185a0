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
  ``retry_after``, no attempt counted); the parts of a long message already
  sent are not sent again by a retry in the same process.
* **Inbound**: :class:`TelegramPoller` long-polls ``getUpdates`` (``orchestrator
  telegram poll``) and ingests each text message with ``channel="telegram"``
  (mirrored to the group's other channels, not back).  The chat is the group
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

from orchestrator.channels.base import BaseChannel
from orchestrator.core.errors import ChannelError, ChannelRateLimited, RateLimited, UnregisteredChatsFull
from orchestrator.core.settings import Settings
from orchestrator.model.render import RenderedMessage
from orchestrator.run.ingest import IncomingMessage, IngestResult, ingest
from orchestrator.store.attachments import chats_on
from orchestrator.store.db import Database

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
    """Sends each delivered message to a Telegram chat (the attachment's address: its chat id)."""

    name = CHANNEL

    def __init__(self, settings: Settings, client: TelegramClient | None = None) -> None:
        self.client = client or TelegramClient(settings)
        # Parts of a long message already sent, by (address, chat, seq): a retry resumes.
        self._progress: dict[tuple[str, str, int], int] = {}
        self._progress_lock = threading.Lock()

    def owns(self, address: str) -> bool:
        return bool(_ADDRESS.match(address.strip()))

    def send(self, address: str, rendered: RenderedMessage) -> None:
        address = address.strip()
        if not self.owns(address):
            raise ChannelError(f"the telegram channel needs a chat id as its address, not {address!r}")
        target: int | str = int(address) if address.lstrip("-").isdigit() else address
        parts = split_text(rendered.text)
        key = (address, rendered.chat_jid, rendered.seq)
        with self._progress_lock:
            done = self._progress.get(key, 0)
        from telegram.error import TelegramError

        for i in range(done, len(parts)):
            text = parts[i]

            # A def, not a lambda: mypy cannot type a lambda with a default argument.
            def send_part(bot: Any, text: str = text) -> Any:
                return bot.send_message(chat_id=target, text=text)

            try:
                self.client.call(send_part)
            except ChannelError:
                raise
            except (TelegramError, Exception) as exc:  # noqa: BLE001 - any failure is a failed send, retried
                raise _channel_error(address, exc) from exc
            with self._progress_lock:
                self._progress[key] = i + 1
        with self._progress_lock:
            self._progress.pop(key, None)

    def disconnect(self) -> None:
        self.client.close()


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
    """Long-polls ``getUpdates`` and ingests each text message (see the module's docs)."""

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
                lambda bot: bot.get_updates(offset=offset, timeout=timeout, allowed_updates=["message"]),
                timeout=timeout + _CALL_TIMEOUT_S,
            )
        except ChannelError:
            raise
        except (TelegramError, Exception) as exc:  # noqa: BLE001 - the poller logs it and polls again
            raise _channel_error("getUpdates", exc) from exc
        if not updates:
            return []
        groups = attached_groups(self.db)
        results = []
        for update in updates:
            incoming = self._incoming(update, groups)
            if incoming is None:
                continue
            try:
                results.append(
                    ingest(self.db, self.settings, incoming, signal=self.signal, signal_delivery=self.signal_delivery)
                )
            except RateLimited as exc:
                self._slow_down(update.message, incoming, exc)
            except UnregisteredChatsFull:
                pass  # an unattached chat past the cap: dropped (ingest counted and logged it)
        # Only after the batch is stored: a crash before this re-reads it, and the ids dedupe it.
        self._write_offset(max(u.update_id for u in updates) + 1)
        return results

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
        if msg is None or not msg.text:
            return None  # only text messages (edits, joins, photos, ... are skipped)
        chat_id = str(msg.chat.id)
        user = msg.from_user
        if user is not None:
            sender, name = f"tg:{user.id}", user.full_name or user.username or str(user.id)
        elif msg.sender_chat is not None:
            sender, name = f"tg:{msg.sender_chat.id}", msg.sender_chat.title or str(msg.sender_chat.id)
        else:
            sender, name = f"tg:{chat_id}", msg.chat.title or chat_id
        return IncomingMessage(
            chat_jid=groups.get(chat_id, f"{UNATTACHED_PREFIX}{chat_id}"),
            sender=sender,
            sender_name=name,
            content=msg.text,
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
        if self._own_client:
            self.client.close()


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
