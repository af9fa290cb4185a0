"""Which channels show a group's messages, and at which address.

The ``group_channels`` table (``orchestrator groups attach JID CHANNEL
[--address X]``); the address defaults to the group's chat id.  Detaching
cancels the channel's unsent deliveries in the same transaction.
"""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Protocol

from pydantic import BaseModel, ConfigDict
from sqlalchemy import delete, select

from orchestrator.core.errors import ChannelError, UnknownGroup
from orchestrator.core.jsontypes import JsonObject
from orchestrator.store.db import Database, changed_rows
from orchestrator.store.deliveries import cancel_pending, validate_channel_name
from orchestrator.store.tables import GroupChannelRow, GroupRow


class _Reaches(Protocol):
    def owns(self, address: str) -> bool: ...


class KnownChannels(Protocol):
    """What attaching asks of a channel registry (``orchestrator.run.outbound.ChannelRegistry``)."""

    @property
    def names(self) -> list[str]: ...

    def get(self, name: str) -> _Reaches | None: ...


class Attachment(BaseModel):
    model_config = ConfigDict(frozen=True)

    chat_jid: str
    channel: str
    address: str  # where on the channel; the group's chat id unless given
    config: JsonObject | None = None  # the channel's own settings: each channel reads its keys


def _attachment(row: GroupChannelRow) -> Attachment:
    return Attachment(
        chat_jid=row.chat_jid, channel=row.channel, address=row.address or row.chat_jid, config=row.config
    )


def attach_channel(
    db: Database,
    chat_jid: str,
    channel: str,
    *,
    address: str | None = None,
    config: JsonObject | None = None,
    registry: KnownChannels | None = None,
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
    with db.write() as session:
        gone = changed_rows(
            session.execute(
                delete(GroupChannelRow).where(GroupChannelRow.chat_jid == chat_jid, GroupChannelRow.channel == channel)
            )
        )
        cancel_pending(session, chat_jid=chat_jid, channel=channel, reason="the channel was detached")
    return bool(gone)


def list_attachments(db: Database, chat_jid: str | None = None) -> list[Attachment]:
    with db.read() as session:
        q = select(GroupChannelRow).order_by(GroupChannelRow.chat_jid, GroupChannelRow.channel)
        if chat_jid is not None:
            q = q.where(GroupChannelRow.chat_jid == chat_jid)
        return [_attachment(r) for r in session.scalars(q)]


def chats_on(db: Database, channel: str) -> list[tuple[str, str | None]]:
    """(group, address as stored: None for the group's chat id) of every group attached to
    ``channel``, by chat id: what a channel's inbound side maps its conversations with."""
    with db.read() as session:
        rows = session.execute(
            select(GroupChannelRow.chat_jid, GroupChannelRow.address)
            .where(GroupChannelRow.channel == channel)
            .order_by(GroupChannelRow.chat_jid)
        ).all()
    return [(chat_jid, address) for chat_jid, address in rows]


def chats_on_with_assistant(db: Database, channel: str) -> list[tuple[str, str | None, str | None]]:
    """As :func:`chats_on`, with the name each group answers to first: its own assistant name,
    else the first of its own trigger names (None: the settings' assistant name), so a
    platform's mention of the bot can be stored as a trigger the group wakes on."""
    with db.read() as session:
        rows = session.execute(
            select(GroupChannelRow.chat_jid, GroupChannelRow.address, GroupRow.assistant_name, GroupRow.trigger_names)
            .join(GroupRow, GroupRow.chat_jid == GroupChannelRow.chat_jid)
            .where(GroupChannelRow.channel == channel)
            .order_by(GroupChannelRow.chat_jid)
        ).all()
    return [
        (chat_jid, address, assistant or (names[0] if isinstance(names, list) and names else None))
        for chat_jid, address, assistant, names in rows
    ]
