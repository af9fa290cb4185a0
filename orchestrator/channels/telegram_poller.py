"""Telegram's inbound side: :class:`TelegramPoller` long-polls ``getUpdates`` (``orchestrator telegram poll``).

Each text message is ingested with ``channel="telegram"`` (mirrored to the group's other
channels, not back), and each document or photo with its caption as the words and its
file fetched into the file store (``channels/telegram_files.py``: only for a registered
group, within ``ORCHESTRATOR_FILE_MAX_BYTES`` and ``ORCHESTRATOR_TELEGRAM_FILE_TIMEOUT_S``;
a file not taken leaves a line in the words saying why).  The chat is the group whose
``telegram`` attachment address is the Telegram chat id; a chat no group is attached to is
stored under ``tg:<chat id>`` and never wakes an agent, like any unregistered chat, within
ingest's bounds on them (how many such chats are kept, and each one's newest messages:
``ORCHESTRATOR_UNREGISTERED_CHATS``, ``ORCHESTRATOR_UNREGISTERED_CHAT_MESSAGES``); a
message past them is dropped (counted and logged by ingest) and polling goes on.

The next offset is kept in ``<data dir>/telegram/offset-<bot>`` after each batch is
stored, and message ids are ``tg-<chat id>-<message id>``, so a restart (or a redelivered
update) stores nothing twice.  A sender over ``ORCHESTRATOR_SENDER_MESSAGES_PER_MINUTE``
gets a reply ("slow down: try again in N s", once per wait) and the message is dropped,
not stored.

The same batch's other updates are handed on: a press on a question's button (a
``callback_query``, ``channels/telegram_questions.py``) and a person's edit of their
message (an ``edited_message``, ``channels/telegram_edits.py``).
"""

from __future__ import annotations

import logging
import os
import threading
import time
from collections.abc import Callable
from typing import Any

from orchestrator.channels.telegram import CHANNEL
from orchestrator.channels.telegram_client import CALL_TIMEOUT_S, TelegramClient, channel_error
from orchestrator.channels.telegram_edits import sender_of, take_telegram_edit
from orchestrator.channels.telegram_files import (
    Attachment,
    FileFetcher,
    attachment_of,
    not_taken,
    too_large_reason,
)
from orchestrator.channels.telegram_questions import take_callback
from orchestrator.core.errors import (
    ChannelError,
    FileTooLarge,
    MessageNotFound,
    RateLimited,
    UnregisteredChatsFull,
)
from orchestrator.core.settings import Settings
from orchestrator.run.ingest import IncomingMessage, IngestResult, ingest
from orchestrator.store.attachments import chats_on
from orchestrator.store.db import Database
from orchestrator.store.file_refs import file_envelope
from orchestrator.store.file_rows import StoredFile
from orchestrator.store.files import FileStore
from orchestrator.store.groups import registered_chats
from orchestrator.store.message_log import resolve_message
from orchestrator.store.usage import sender_retry_after

log = logging.getLogger(__name__)

UNATTACHED_PREFIX = "tg:"


def attached_groups(db: Database) -> dict[str, str]:
    """Telegram chat id -> the group attached to it (the first by chat id when several are)."""
    found: dict[str, str] = {}
    for chat_jid, address in chats_on(db, CHANNEL):
        found.setdefault((address or chat_jid).strip(), chat_jid)
    return found


class TelegramPoller:
    """Long-polls ``getUpdates`` and ingests each text message, and each document or photo
    with its file (see the module's docs); hands a button's press and a person's edit on."""

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
        self.client = client or TelegramClient(settings.telegram)
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
                timeout=timeout + CALL_TIMEOUT_S,
            )
        except ChannelError:
            raise
        except (TelegramError, Exception) as exc:  # the poller logs it and polls again
            raise channel_error("getUpdates", exc) from exc
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
        return attachment_of(msg, self.settings.files.max_bytes)

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
        limit = self.settings.quotas.sender_messages_per_minute
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
