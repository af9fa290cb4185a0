"""Channels: where stored messages are shown to people.

A channel has a ``name`` (the registry's key and what a group's attachment
names), may ``connect()``/``disconnect()``, says which addresses it
``owns()``, and ``send()``\\s one :class:`~orchestrator.render.RenderedMessage`
to one address, raising on failure.  Which channels show a group's messages
is data: the ``group_channels`` table (``orchestrator groups attach JID
CHANNEL [--address X]``); the address defaults to the group's chat id.
Delivery itself (recorded per message and channel, retried, never twice)
is ``orchestrator/deliveries.py``.

Built in: ``log`` (the worker's log) and ``webhook`` (POST to the
attachment's URL, ``orchestrator/webhooks.py``).  More channels come from
``ORCHESTRATOR_CHANNEL_PLUGINS``: ``module:factory`` entries, each called
with the settings and returning a channel or a list of channels.
"""

from __future__ import annotations

import importlib
import logging
import re
from collections.abc import Iterable, Iterator
from datetime import UTC, datetime
from typing import Any, Protocol, runtime_checkable

from pydantic import BaseModel, ConfigDict
from sqlalchemy import delete, select

from .db import Database
from .errors import ChannelError, UnknownGroup
from .render import RenderedMessage
from .settings import Settings
from .tables import GroupChannelRow, GroupRow

log = logging.getLogger(__name__)

_NAME = re.compile(r"^[a-z0-9][a-z0-9_-]{0,63}$")


@runtime_checkable
class Channel(Protocol):
    name: str

    def connect(self) -> None: ...

    def disconnect(self) -> None: ...

    def owns(self, chat_jid: str) -> bool: ...

    def send(self, chat_jid: str, rendered: RenderedMessage) -> None: ...


class BaseChannel:
    """Defaults for a channel that needs no connection and can reach any address."""

    name = "base"

    def connect(self) -> None:
        pass

    def disconnect(self) -> None:
        pass

    def owns(self, chat_jid: str) -> bool:
        return True

    def send(self, chat_jid: str, rendered: RenderedMessage) -> None:
        raise NotImplementedError


class LogChannel(BaseChannel):
    """Writes each message to the log (the worker's console)."""

    name = "log"

    def __init__(self, logger: logging.Logger | None = None) -> None:
        self._log = logger or logging.getLogger("orchestrator.channel.log")

    def send(self, chat_jid: str, rendered: RenderedMessage) -> None:
        self._log.info("[%s #%d] %s", chat_jid, rendered.seq, rendered.text)


def validate_channel_name(name: str) -> str:
    if not _NAME.match(name or ""):
        raise ChannelError(f"channel name {name!r} must be 1-64 lowercase letters, digits, '-' or '_'")
    return name


class ChannelRegistry:
    """The channels this process can send on, by name."""

    def __init__(self, channels: Iterable[Channel] = ()) -> None:
        self._channels: dict[str, Channel] = {}
        for ch in channels:
            self.add(ch)

    def add(self, channel: Channel) -> None:
        validate_channel_name(channel.name)
        if channel.name in self._channels:
            raise ChannelError(f"two channels are named {channel.name!r}")
        channel.connect()
        self._channels[channel.name] = channel

    def get(self, name: str) -> Channel | None:
        return self._channels.get(name)

    def __contains__(self, name: object) -> bool:
        return name in self._channels

    def __iter__(self) -> Iterator[Channel]:
        return iter(list(self._channels.values()))

    @property
    def names(self) -> list[str]:
        return sorted(self._channels)

    def close(self) -> None:
        for ch in self._channels.values():
            try:
                ch.disconnect()
            except Exception:  # noqa: BLE001 - closing the others matters more
                log.exception("channel %s did not disconnect cleanly", ch.name)


def build_registry(settings: Settings) -> ChannelRegistry:
    """The built-in channels plus the configured plugins (what a worker, and the CLI, know)."""
    from .webhooks import WebhookChannel  # imports this module

    registry = ChannelRegistry([LogChannel(), WebhookChannel(settings)])
    for spec in filter(None, (s.strip() for s in settings.channel_plugins.split(","))):
        module, _, attr = spec.partition(":")
        try:
            factory = getattr(importlib.import_module(module), attr)
        except (ImportError, AttributeError, ValueError) as exc:
            raise ChannelError(f"channel plugin {spec!r} cannot be loaded: {exc}") from exc
        made = factory(settings)
        for ch in made if isinstance(made, list | tuple) else [made]:
            registry.add(ch)
    return registry


# -- which channels a group is attached to -----------------------------------------


class Attachment(BaseModel):
    model_config = ConfigDict(frozen=True)

    chat_jid: str
    channel: str
    address: str  # where on the channel; the group's chat id unless given
    config: dict[str, Any] | None = None


def _attachment(row: GroupChannelRow) -> Attachment:
    return Attachment(chat_jid=row.chat_jid, channel=row.channel, address=row.address or row.chat_jid,
                      config=row.config)


def attach_channel(
    db: Database, chat_jid: str, channel: str, *, address: str | None = None,
    config: dict[str, Any] | None = None, registry: ChannelRegistry | None = None,
) -> Attachment:
    """Show group ``chat_jid``'s messages on ``channel`` (again: changes its address/config).

    With a ``registry`` the channel must be one of its own and own the address.
    Messages stored before the attachment are not sent.
    """
    validate_channel_name(channel)
    if address is not None and not address.strip():
        raise ChannelError("an address must not be empty")
    if config is not None and not isinstance(config, dict):
        raise ChannelError("a channel's config must be a JSON object")
    if registry is not None:
        ch = registry.get(channel)
        if ch is None:
            raise ChannelError(f"no channel named {channel!r} (known: {', '.join(registry.names)})")
        if not ch.owns(address or chat_jid):
            raise ChannelError(f"channel {channel!r} cannot reach {address or chat_jid!r}")
    with db.write() as session:
        if session.get(GroupRow, chat_jid) is None:
            raise UnknownGroup(chat_jid)
        row = session.get(GroupChannelRow, (chat_jid, channel))
        if row is None:
            row = GroupChannelRow(chat_jid=chat_jid, channel=channel, created_at=datetime.now(UTC))
            session.add(row)
        row.address, row.config = address, config
        session.flush()
        return _attachment(row)


def detach_channel(db: Database, chat_jid: str, channel: str) -> bool:
    """Stop showing the group on ``channel``; its unsent deliveries there are cancelled."""
    from .deliveries import cancel_pending

    with db.write() as session:
        gone = session.execute(
            delete(GroupChannelRow).where(GroupChannelRow.chat_jid == chat_jid, GroupChannelRow.channel == channel)
        ).rowcount
        cancel_pending(session, chat_jid=chat_jid, channel=channel, reason="the channel was detached")
    return bool(gone)


def list_attachments(db: Database, chat_jid: str | None = None) -> list[Attachment]:
    with db.read() as session:
        q = select(GroupChannelRow).order_by(GroupChannelRow.chat_jid, GroupChannelRow.channel)
        if chat_jid is not None:
            q = q.where(GroupChannelRow.chat_jid == chat_jid)
        return [_attachment(r) for r in session.scalars(q)]
