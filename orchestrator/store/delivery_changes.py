"""Changes to what channels already show: edits and retractions of sent deliveries.

A history change (``orchestrator/store/history.py``) calls :func:`record_changes` in its
own transaction, with one rule for every channel:

* an **edited** message's sent deliveries get an ``update`` (the channel shows the
  message as it is now, in place where it can, else retracted and sent again);
* a **superseded** message (regenerate, truncate, an edit that reruns) has its unsent
  deliveries cancelled at once ("superseded before it was sent") and its sent ones get a
  ``retract``.  After a rerun (regenerate, an edit that reruns) the ``retract`` of an agent's reply is
  held (``ORCHESTRATOR_RERUN_REPLACE_S``): the rerun's reply to the same message takes its
  posts over and is shown in their place (:func:`take_over_posts`, from the deliverer's
  send), and only a reply no rerun replaced is retracted when the hold is over.

A **reaction** (``store/reactions.py``) gets a ``react`` for each delivery of its message
(sent, or still to be: it waits for the send) and one for the channel a person's message
came from, if it is attached: that one names no delivery of ours (``delivery_id`` NULL) but
the channel's ``address``, and the deliverer asks the channel which post of its own the
message was (its inbound id).

A delivery still being sent gets its change too: the change waits until the send ends,
and is cancelled if the send never reached the channel.  A sent delivery whose channel
kept no ids of its posts (``deliveries.sent_ids`` NULL: sent before revision 0024) gets
none: there is nothing to name.  An update already waiting for a delivery (not claimed
yet) shows the newest text when it goes, so a second one is not recorded.

The deliverer (``orchestrator/run/outbound_changes.py``) works the rows as it works the
sends (``orchestrator/store/claims.py``): claimed one at a time, retried with backoff,
``failed`` after the last attempt; per delivery in the order they were made; a claim
whose deliverer died is made again only on the channels whose receivers deduplicate (the
webhook), else it ends ``failed``.  States: :data:`ChangeState`.
"""

from __future__ import annotations

from collections.abc import Collection
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Annotated, Any, Final, Literal, TypedDict, get_args

from pydantic import BaseModel, ConfigDict
from sqlalchemy import and_, exists, insert, or_, select, update
from sqlalchemy.orm import Session, aliased

from orchestrator.model.messages import SENDER_BOT, StoredMessage
from orchestrator.model.render import ORIGIN_CHANNEL_KEY
from orchestrator.model.views import REPLY_TO_KEY
from orchestrator.store.claims import CANCELLED, FAILED, PENDING, SENDING, claim_row, end_claim, end_values
from orchestrator.store.db import Database
from orchestrator.store.deliveries import (
    SENT,
    SUPERSEDED_UNSENT,
    Delivery,
    attached_channels,
    cancel_pending,
    outgoing,
    unfinished,
    utc_now,
)
from orchestrator.store.message_log import to_stored
from orchestrator.store.stored_literals import column_check
from orchestrator.store.tables import DeliveryChangeRow, DeliveryRow, GroupRow, MessageRow, ReactionRow

ChangeKind = Literal["update", "retract", "react"]
KINDS: tuple[ChangeKind, ...] = get_args(ChangeKind)
UPDATE: Final = "update"
RETRACT: Final = "retract"
REACT: Final = "react"
ChangeState = Literal["pending", "sending", "done", "failed", "cancelled"]
STATES: tuple[ChangeState, ...] = get_args(ChangeState)
DONE: Final = "done"


class DeliveryChange(BaseModel):
    model_config = ConfigDict(frozen=True)

    id: int
    delivery_id: int | None  # None: a reaction on the channel a person's message came from
    chat_jid: str
    channel: str
    message_seq: int
    kind: Annotated[ChangeKind, column_check(KINDS, "delivery_changes.kind")]
    state: Annotated[ChangeState, column_check(STATES, "delivery_changes.state")]
    attempts: int
    next_attempt_at: datetime
    last_error: str | None
    created_at: datetime
    done_at: datetime | None
    reaction_id: int | None = None  # a react's
    address: str | None = None  # a react's without a delivery


class _NewChange(TypedDict, total=False):
    delivery_id: int | None
    chat_jid: str
    channel: str
    message_seq: int
    kind: ChangeKind
    state: ChangeState
    attempts: int
    next_attempt_at: datetime
    created_at: datetime
    reaction_id: int
    address: str


def _new_change(chat_jid: str, channel: str, seq: int, kind: ChangeKind, now: datetime) -> _NewChange:
    return {
        "chat_jid": chat_jid,
        "channel": channel,
        "message_seq": seq,
        "kind": kind,
        "state": PENDING,
        "attempts": 0,
        "next_attempt_at": now,
        "created_at": now,
    }


def record_changes(
    session: Session,
    chat_jid: str,
    *,
    edited: Collection[int] = (),
    superseded: Collection[int] = (),
    hold_replies_s: float = 0.0,
) -> int:
    """Queue what the channels must change after ``edited`` and ``superseded`` (seqs of
    ``chat_jid``) changed, in the caller's transaction (see the module's doc); how many.
    ``hold_replies_s``: a rerun's; the retractions of the agent's superseded replies wait that
    long for the rerun's replies to take their posts over (:func:`take_over_posts`)."""
    if superseded:
        cancel_pending(session, chat_jid=chat_jid, seqs=list(superseded), reason=SUPERSEDED_UNSENT)
    kinds: dict[int, ChangeKind] = dict.fromkeys(edited, UPDATE)
    kinds.update(dict.fromkeys(superseded, RETRACT))
    if not kinds:
        return 0
    # After the cancel: a send a deliverer claimed first is "sending" here, and its change waits for it.
    # A sent one without ids has nothing to name.
    sent = session.execute(
        select(DeliveryRow.id, DeliveryRow.channel, DeliveryRow.message_seq, MessageRow.sender, MessageRow.message_type)
        .join(MessageRow, and_(MessageRow.chat_jid == DeliveryRow.chat_jid, MessageRow.seq == DeliveryRow.message_seq))
        .where(
            DeliveryRow.chat_jid == chat_jid,
            DeliveryRow.message_seq.in_(list(kinds)),
            or_(DeliveryRow.state == SENDING, and_(DeliveryRow.state == SENT, DeliveryRow.sent_ids.is_not(None))),
        )
        .order_by(DeliveryRow.message_seq, DeliveryRow.channel)
    ).all()
    waiting = set(
        session.scalars(
            select(DeliveryChangeRow.delivery_id).where(
                DeliveryChangeRow.delivery_id.in_([d.id for d in sent]),
                DeliveryChangeRow.kind == UPDATE,
                DeliveryChangeRow.state == PENDING,
            )
        )
    )
    now = utc_now()
    held = now + timedelta(seconds=hold_replies_s)
    rows: list[_NewChange] = []
    for d in sent:
        kind = kinds[d.message_seq]
        if kind == UPDATE and d.id in waiting:
            continue
        row = _new_change(chat_jid, d.channel, d.message_seq, kind, now) | {"delivery_id": d.id}
        if kind == RETRACT and hold_replies_s > 0 and d.sender == SENDER_BOT and d.message_type == "assistant":
            row["next_attempt_at"] = held  # a rerun's reply may take its posts over
        rows.append(row)
    if rows:
        session.execute(insert(DeliveryChangeRow), rows)
    return len(rows)


def record_reaction(session: Session, message: StoredMessage, reaction_id: int) -> int:
    """Queue reaction ``reaction_id`` on ``message`` for every channel that shows it, in the
    caller's transaction (see the module's doc); how many."""
    now = utc_now()
    rows: list[_NewChange] = []
    origin = (message.metadata or {}).get(ORIGIN_CHANNEL_KEY)
    for channel, address in attached_channels(session.connection(), message.chat_jid):
        if channel == origin:
            row = _new_change(message.chat_jid, channel, message.seq, REACT, now)
            rows.append(row | {"delivery_id": None, "reaction_id": reaction_id, "address": address or message.chat_jid})
    # Deliveries still to be sent too (the change waits for the send); a sent one without ids has nothing to name.
    shown = session.execute(
        select(DeliveryRow.id, DeliveryRow.channel)
        .where(
            DeliveryRow.chat_jid == message.chat_jid,
            DeliveryRow.message_seq == message.seq,
            or_(
                DeliveryRow.state.in_([PENDING, SENDING]),
                and_(DeliveryRow.state == SENT, DeliveryRow.sent_ids.is_not(None)),
            ),
        )
        .order_by(DeliveryRow.channel)
    ).all()
    for d in shown:
        row = _new_change(message.chat_jid, d.channel, message.seq, REACT, now)
        rows.append(row | {"delivery_id": d.id, "reaction_id": reaction_id})
    if rows:
        session.execute(insert(DeliveryChangeRow), rows)
    return len(rows)


def take_over_posts(db: Database, delivery: Delivery, reply_to: int) -> list[str] | None:
    """The posts of a superseded reply of the agent to message ``reply_to`` that ``delivery``
    (the send of a rerun's reply to it, on the same channel and address) takes over, to show
    its message there in place: the oldest whose retraction is still held for a rerun
    (:func:`record_changes`'s ``hold_replies_s``), cancelled here ("replaced in place") and its
    ids written on ``delivery`` in the same transaction, so that a retried send edits them
    again rather than post anew.  None: there is none to take (the send posts as usual)."""
    with db.write() as session:
        held = session.execute(
            select(DeliveryChangeRow.id, DeliveryRow.sent_ids, MessageRow.meta)
            .join(DeliveryRow, DeliveryRow.id == DeliveryChangeRow.delivery_id)
            .join(
                MessageRow, and_(MessageRow.chat_jid == DeliveryRow.chat_jid, MessageRow.seq == DeliveryRow.message_seq)
            )
            .where(
                DeliveryChangeRow.chat_jid == delivery.chat_jid,
                DeliveryChangeRow.channel == delivery.channel,
                DeliveryChangeRow.kind == RETRACT,
                DeliveryChangeRow.state == PENDING,
                DeliveryChangeRow.attempts == 0,
                # Held, not a retry's backoff: a rerun's retraction waits from the start.
                DeliveryChangeRow.next_attempt_at > DeliveryChangeRow.created_at,
                DeliveryChangeRow.next_attempt_at > utc_now(),
                DeliveryRow.address == delivery.address,
                DeliveryRow.sent_ids.is_not(None),
                MessageRow.sender == SENDER_BOT,
                MessageRow.superseded_at.is_not(None),
            )
            .order_by(DeliveryRow.message_seq)
        ).all()
        for change_id, sent_ids, meta in held:
            if (meta or {}).get(REPLY_TO_KEY) != reply_to or not sent_ids:
                continue
            taken = session.execute(
                update(DeliveryChangeRow)
                .where(DeliveryChangeRow.id == change_id, DeliveryChangeRow.state == PENDING)
                .values(state=CANCELLED, last_error=f"replaced in place by #{delivery.message_seq}", done_at=utc_now())
            )
            if taken.rowcount != 1:  # type: ignore[attr-defined]
                continue
            session.execute(update(DeliveryRow).where(DeliveryRow.id == delivery.id).values(sent_ids=list(sent_ids)))
            return list(sent_ids)
    return None


# -- the deliverer's (orchestrator/run/outbound_changes.py) ----------------------------------


def _ready(c: type[DeliveryChangeRow] | Any, now: datetime) -> Any:
    """Pending and due, its send over (sent, or ended without reaching the channel; a change
    without a delivery has none to wait for), and no earlier change of the same delivery
    unfinished."""
    earlier = aliased(DeliveryChangeRow)
    blocked = exists().where(earlier.delivery_id == c.delivery_id, earlier.id < c.id, unfinished(earlier))
    settled = exists().where(DeliveryRow.id == c.delivery_id, DeliveryRow.state.in_([SENT, FAILED, CANCELLED]))
    return and_(c.state == PENDING, c.next_attempt_at <= now, or_(c.delivery_id.is_(None), settled), ~blocked)


def ready_change_ids(
    db: Database, *, chat_jid: str | None = None, channels: Collection[str] | None = None, limit: int = 100
) -> list[int]:
    """The ids of the changes ready now (of one chat, on some channels), oldest first."""
    q = select(DeliveryChangeRow.id).where(_ready(DeliveryChangeRow, utc_now()))
    if chat_jid is not None:
        q = q.where(DeliveryChangeRow.chat_jid == chat_jid)
    if channels is not None:
        q = q.where(DeliveryChangeRow.channel.in_(channels))
    with db.read() as session:
        return list(session.scalars(q.order_by(DeliveryChangeRow.id).limit(limit)))


def claim_change(db: Database, change_id: int, owner: str, claim_s: float) -> bool:
    """Claim the change for ``owner`` if it is ready (``orchestrator/store/claims.py``)."""
    return claim_row(db, DeliveryChangeRow, change_id, _ready(DeliveryChangeRow, utc_now()), owner, claim_s)


@dataclass(frozen=True)
class OutgoingChange:
    """A claimed change with the delivery it changes (None: a reaction where a person's
    message came from), its message, its group's assistant name, and a react's emoji."""

    change: DeliveryChange
    delivery: Delivery | None
    message: StoredMessage | None  # None: no such message any more
    assistant_name: str | None
    emoji: str | None = None


def outgoing_change(db: Database, change_id: int) -> OutgoingChange:
    with db.read() as session:
        row = session.get(DeliveryChangeRow, change_id)
        assert row is not None  # claimed by the caller: rows are never deleted
        change = DeliveryChange.model_validate(row, from_attributes=True)
        emoji = None
        if change.reaction_id is not None:
            emoji = session.scalar(select(ReactionRow.emoji).where(ReactionRow.id == change.reaction_id))
        if change.delivery_id is None:
            msg = session.scalar(
                select(MessageRow).where(MessageRow.chat_jid == change.chat_jid, MessageRow.seq == change.message_seq)
            )
            group = session.get(GroupRow, change.chat_jid)
            return OutgoingChange(
                change,
                None,
                to_stored(msg) if msg is not None else None,
                group.assistant_name if group is not None else None,
                emoji,
            )
    sent = outgoing(db, change.delivery_id)
    return OutgoingChange(change, sent.delivery, sent.message, sent.assistant_name, emoji)


def finish_change(
    db: Database,
    change: DeliveryChange,
    owner: str,
    *,
    state: ChangeState,
    last_error: str | None = None,
    next_attempt_at: datetime | None = None,
    give_back_attempt: bool = False,
    sent_ids: list[str] | None = None,
) -> None:
    """End ``owner``'s claim on ``change``; done with ``sent_ids``: the ids of the delivery's
    posts now (an update that posted anew), written in the same transaction."""
    values = end_values(
        DeliveryChangeRow,
        state,
        last_error=last_error,
        next_attempt_at=next_attempt_at,
        give_back_attempt=give_back_attempt,
    )
    if state == DONE:
        values["done_at"] = utc_now()
    with db.write() as session:
        held = end_claim(session, DeliveryChangeRow, change.id, owner, values)
        if held and sent_ids is not None and change.delivery_id is not None:
            delivery = session.get(DeliveryRow, change.delivery_id)
            assert delivery is not None
            delivery.sent_ids = sent_ids


def list_changes(
    db: Database, *, chat_jid: str | None = None, delivery_id: int | None = None, limit: int = 200
) -> list[DeliveryChange]:
    """Oldest first."""
    q = select(DeliveryChangeRow).order_by(DeliveryChangeRow.id).limit(limit)
    if chat_jid is not None:
        q = q.where(DeliveryChangeRow.chat_jid == chat_jid)
    if delivery_id is not None:
        q = q.where(DeliveryChangeRow.delivery_id == delivery_id)
    with db.read() as session:
        return [DeliveryChange.model_validate(r, from_attributes=True) for r in session.scalars(q)]
