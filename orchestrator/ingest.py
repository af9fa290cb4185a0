"""Ingest: the one path every incoming message takes.

Store the message and mark the group's pending work in ONE transaction, then,
only after the commit, signal a worker.  A crash between commit and signal
loses nothing: the pending mark is in the database and the sweeper
re-signals it.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

from pydantic import BaseModel, ConfigDict, Field
from sqlalchemy import update
from sqlalchemy.orm import Session

from .db import Database
from .deliveries import record_deliveries, with_origin
from .groups import group_from_row
from .messages import MessageType, NewMessage, StoredMessage
from .router import wakes_agent
from .settings import Settings
from .store import insert_message, new_message_id, now_iso
from .tables import GroupRow

log = logging.getLogger(__name__)

Signal = Callable[[str], object]


class IncomingMessage(BaseModel):
    """A message as a channel hands it in (validated at the boundary)."""

    model_config = ConfigDict(extra="forbid")

    chat_jid: str = Field(min_length=1)
    sender: str = Field(min_length=1)
    sender_name: str = ""
    content: str
    id: str | None = None
    timestamp: str | None = None
    is_from_me: bool = False
    message_type: MessageType = "user"
    metadata: dict[str, Any] | None = None
    # The channel it arrived on: mirrored to the group's other channels, not back.
    channel: str | None = Field(default=None, pattern=r"^[a-z0-9][a-z0-9_-]{0,63}$")


class IngestResult(BaseModel):
    message: StoredMessage
    created: bool
    triggered: bool
    signalled: bool


def mark_pending(session: Session, chat_jid: str, seq: int) -> None:
    """Record, inside the caller's transaction, that ``seq`` should wake the agent."""
    session.execute(
        update(GroupRow).where(GroupRow.chat_jid == chat_jid, GroupRow.pending_seq < seq).values(pending_seq=seq)
    )


def ingest(
    db: Database,
    settings: Settings,
    incoming: IncomingMessage,
    *,
    signal: Signal | None,
    wake: bool | None = None,
    signal_delivery: Signal | None = None,
) -> IngestResult:
    """Store ``incoming``; if it wakes the agent, mark pending work and signal.

    ``wake`` overrides the routing rules (a scheduled task wakes its group
    whatever the trigger setting); it still needs a registered group.
    ``signal_delivery`` is told the chat when the message is queued for its
    group's channels (``orchestrator/deliveries.py``).
    """
    with db.write() as session:
        new = NewMessage(
            id=incoming.id or new_message_id(),
            timestamp=incoming.timestamp or now_iso(),
            **incoming.model_dump(exclude={"id", "timestamp", "channel", "metadata"}),
            metadata=with_origin(incoming.metadata, incoming.channel),
        )
        msg, created = insert_message(session, db, new)
        triggered = False
        queued = 0
        if created:
            queued = record_deliveries(session, msg)
            # Read the group inside the same transaction as the insert.
            row = session.get(GroupRow, incoming.chat_jid)
            group = group_from_row(row) if row is not None else None
            if wake is None:
                triggered = wakes_agent(msg, group, settings.trigger_names)
            else:
                triggered = wake and group is not None
            if triggered:
                mark_pending(session, incoming.chat_jid, msg.seq)
    signalled = False
    if triggered and signal is not None:
        try:
            signal(incoming.chat_jid)
            signalled = True
        except Exception as exc:  # noqa: BLE001 - the broker is down, the work is not lost
            # The message and its pending mark are committed; the sweeper
            # re-signals the group once the broker is back.
            log.warning("could not signal a worker for %s (%s); the sweeper will", incoming.chat_jid, exc)
    if queued and signal_delivery is not None:
        try:
            signal_delivery(incoming.chat_jid)
        except Exception as exc:  # noqa: BLE001 - the sweeper re-signals due deliveries
            log.warning("could not signal a deliverer for %s (%s); the sweeper will", incoming.chat_jid, exc)
    return IngestResult(message=msg, created=created, triggered=triggered, signalled=signalled)
