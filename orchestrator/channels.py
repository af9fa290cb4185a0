"""Channels: where stored messages are shown to people.

A channel owns some chat ids and sends rendered messages to them.  The run
pipeline hands every stored output to :meth:`ChannelRegistry.deliver`, which
gives it to each channel that owns the chat.  Channel failures are logged and
never break a run (the message is already stored; readers of the store, such
as ``orchestrator send --wait`` and the HTTP API, see it regardless).
"""

from __future__ import annotations

import logging
from typing import Protocol, runtime_checkable

from .messages import StoredMessage
from .render import render_text

log = logging.getLogger(__name__)


@runtime_checkable
class Channel(Protocol):
    name: str

    def connect(self) -> None: ...

    def disconnect(self) -> None: ...

    def owns(self, chat_jid: str) -> bool: ...

    def send(self, message: StoredMessage, rendered: str) -> None: ...


class BaseChannel:
    """Defaults for a channel that needs no connection and serves every chat."""

    name = "base"

    def connect(self) -> None:
        pass

    def disconnect(self) -> None:
        pass

    def owns(self, chat_jid: str) -> bool:
        return True

    def send(self, message: StoredMessage, rendered: str) -> None:
        raise NotImplementedError


class LogChannel(BaseChannel):
    """Writes every message of every chat to the log (the worker's console)."""

    name = "log"

    def __init__(self, logger: logging.Logger | None = None) -> None:
        self._log = logger or logging.getLogger("orchestrator.channel.log")

    def send(self, message: StoredMessage, rendered: str) -> None:
        self._log.info("[%s #%d] %s", message.chat_jid, message.seq, rendered)


class ChannelRegistry:
    def __init__(self, assistant_name: str, channels: list[Channel] | None = None) -> None:
        self.assistant_name = assistant_name
        self.channels: list[Channel] = list(channels or [])

    def add(self, channel: Channel) -> None:
        channel.connect()
        self.channels.append(channel)

    def deliver(self, message: StoredMessage) -> int:
        """Send ``message`` to every channel owning its chat; returns how many took it."""
        rendered = render_text(message, self.assistant_name)
        delivered = 0
        for ch in self.channels:
            if not ch.owns(message.chat_jid):
                continue
            try:
                ch.send(message, rendered)
                delivered += 1
            except Exception:  # noqa: BLE001 - one bad channel must not stop the others
                log.exception("channel %s failed to deliver message %s", ch.name, message.id)
        return delivered
