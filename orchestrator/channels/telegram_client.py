"""The Telegram Bot API client: one ``telegram.Bot`` (python-telegram-bot) for synchronous callers.

python-telegram-bot is asynchronous; :class:`TelegramClient` runs it on a private event
loop in a daemon thread (one per process, made again after a fork), so the synchronous
deliverer and the poller can call it from any thread.  A failed call becomes the
deliverer's kind of failure (:func:`channel_error`): flood control (429) a
``ChannelRateLimited`` retried after its ``retry_after``, anything else a
``ChannelError``.
"""

from __future__ import annotations

import asyncio
import hashlib
import logging
import os
import threading
import warnings
from collections.abc import Callable, Coroutine
from datetime import timedelta
from typing import Any, TypeVar

from orchestrator.core.errors import ChannelError, ChannelRateLimited
from orchestrator.core.settings import TelegramSettings

log = logging.getLogger(__name__)

CALL_TIMEOUT_S = 30.0

T = TypeVar("T")


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

    def __init__(self, telegram: TelegramSettings) -> None:
        if not telegram.bot_token:
            raise ChannelError("set ORCHESTRATOR_TELEGRAM_BOT_TOKEN to use the telegram channel")
        _require_ptb()
        self._token = telegram.bot_token
        self._base = telegram.api_base.rstrip("/")
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

    def call(self, make: Callable[[Any], Coroutine[Any, Any, T]], timeout: float = CALL_TIMEOUT_S) -> T:
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
            except Exception:  # stopping the loop matters more
                log.exception("the telegram bot did not shut down cleanly")
        loop.call_soon_threadsafe(loop.stop)
        if thread is not None:
            thread.join(10)
        if not loop.is_running():
            loop.close()


def channel_error(address: str, exc: Exception) -> ChannelError:
    """A failed Bot API call (``address``: the chat, or the method) as the deliverer takes it:
    ChannelRateLimited under flood control, else ChannelError."""
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
