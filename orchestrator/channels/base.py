"""What every channel adapter starts from.

A channel has a ``name`` (the registry's key and what a group's attachment
names), may ``connect()``/``disconnect()``, says which addresses it
``owns()``, and ``send()``\\s one :class:`~orchestrator.model.render.RenderedMessage`
to one address, raising on failure (the port is
:class:`orchestrator.run.outbound.Channel`).  Which channels show a group's
messages is data (``orchestrator/store/attachments.py``); delivery itself
(recorded per message and channel, retried, never twice) is the ledger in
``orchestrator/store/deliveries.py`` worked by
``orchestrator/run/outbound.py``.
"""

from __future__ import annotations

import logging
from collections.abc import Callable

from orchestrator.core.settings import Settings
from orchestrator.core.terminal import for_log
from orchestrator.model.render import RenderedMessage
from orchestrator.store.db import Database


class BaseChannel:
    """Defaults for a channel that needs no connection and can reach any address."""

    name = "base"
    # Whether a send cut short by a deliverer's death is sent again (at least once)
    # rather than given up (at most once): only for a channel whose receiver can tell
    # a resend by its delivery id (``RenderedMessage.delivery_id``; the webhook's header).
    resend_after_crash = False

    def connect(self) -> None:
        pass

    def disconnect(self) -> None:
        pass

    def owns(self, address: str) -> bool:
        return True

    def send(self, address: str, rendered: RenderedMessage) -> None:
        raise NotImplementedError


class LogChannel(BaseChannel):
    """Writes each message to the log (the worker's console), as one line: its newlines,
    carriage returns and control characters shown as escapes (``core/terminal.py``), so
    a message can neither drive the terminal showing the log nor forge a line of it."""

    name = "log"

    def __init__(self, logger: logging.Logger | None = None) -> None:
        self._log = logger or logging.getLogger("orchestrator.channel.log")

    def send(self, address: str, rendered: RenderedMessage) -> None:
        self._log.info("[%s #%d] %s", for_log(address), rendered.seq, for_log(rendered.text))


class InboundDoor:
    """What a channel's inbound side (an HTTP route's, or a socket's) takes a message in
    with: the store, the settings, the signals that wake the group and the deliverer,
    and the longest message it stores."""

    def __init__(
        self,
        db: Database,
        settings: Settings,
        *,
        signal: Callable[[str], object],
        signal_delivery: Callable[[str], object] | None,
        max_chars: int,
    ) -> None:
        self.db, self.settings = db, settings
        self.signal, self.signal_delivery = signal, signal_delivery
        self.max_chars = max_chars
        self._open()

    def _open(self) -> None:
        """What a channel's door sets up from the settings, once its fields are set."""
