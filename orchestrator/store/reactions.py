"""Reactions: an emoji on a message of a chat, kept once per reactor (table ``reactions``).

The agent reacts with ``add_reaction`` (``run/chat_outputs.py``) to a person's message of
its own chat: :func:`react_to_person` finds it (``nth_last`` back among people's messages
that are not superseded), in one transaction fenced by the run's lease, keeps the reaction
(the same emoji on the same message again is no change), and queues a ``react`` change for
every channel that shows the message (``store/delivery_changes.py``:
:func:`~orchestrator.store.delivery_changes.record_reaction`).  The open event streams are
woken; they send each reaction once (``http/stream.py``), and the page draws badges.
"""

from __future__ import annotations

from datetime import UTC, datetime

from pydantic import BaseModel, ConfigDict
from sqlalchemy import select

from orchestrator.model.messages import SENDER_BOT, StoredMessage
from orchestrator.store import leases
from orchestrator.store.chat_wakeups import chat_changed
from orchestrator.store.db import Database
from orchestrator.store.delivery_changes import record_reaction
from orchestrator.store.message_log import nth_last_live, to_stored
from orchestrator.store.tables import MessageRow, ReactionRow


class Reaction(BaseModel):
    model_config = ConfigDict(frozen=True)

    id: int
    chat_jid: str
    message_seq: int
    emoji: str
    sender: str  # who reacted: the agent is ``bot``
    run_id: str | None
    created_at: datetime


class Reacted(BaseModel):
    """What :func:`react_to_person` did: the message, the reaction, and whether it is new."""

    model_config = ConfigDict(frozen=True)

    message: StoredMessage
    reaction: Reaction
    created: bool  # False: the agent had put this emoji there already
    changes: int  # channels asked to show it


def react_to_person(
    db: Database, chat_jid: str, emoji: str, *, nth_last: int, owner: str, by_run: str
) -> Reacted | None:
    """The agent of ``owner``'s run puts ``emoji`` on the ``nth_last`` message of a person in
    ``chat_jid`` (see the module's doc).  None when there is no such message."""
    with db.write() as session:
        leases.fence(session, chat_jid, owner)
        row = nth_last_live(
            session, chat_jid, nth_last, MessageRow.message_type == "user", MessageRow.sender != SENDER_BOT
        )
        if row is None:
            return None
        message = to_stored(row)
        kept = session.scalars(
            select(ReactionRow).where(
                ReactionRow.chat_jid == chat_jid,
                ReactionRow.message_seq == row.seq,
                ReactionRow.emoji == emoji,
                ReactionRow.sender == SENDER_BOT,
            )
        ).first()
        if kept is not None:
            return Reacted(message=message, reaction=_reaction(kept), created=False, changes=0)
        new = ReactionRow(
            chat_jid=chat_jid,
            message_seq=row.seq,
            emoji=emoji,
            sender=SENDER_BOT,
            run_id=by_run,
            created_at=datetime.now(UTC),
        )
        session.add(new)
        session.flush()
        changes = record_reaction(session, message, new.id)
        chat_changed(session, chat_jid)
        return Reacted(message=message, reaction=_reaction(new), created=True, changes=changes)


def reactions_after(db: Database, chat_jid: str, after_id: int = 0, *, limit: int = 500) -> list[Reaction]:
    """``chat_jid``'s reactions with ids past ``after_id``, oldest first (the streams' cursor)."""
    with db.read() as session:
        rows = session.scalars(
            select(ReactionRow)
            .where(ReactionRow.chat_jid == chat_jid, ReactionRow.id > after_id)
            .order_by(ReactionRow.id)
            .limit(limit)
        )
        return [_reaction(r) for r in rows]


def _reaction(row: ReactionRow) -> Reaction:
    return Reaction.model_validate(row, from_attributes=True)
