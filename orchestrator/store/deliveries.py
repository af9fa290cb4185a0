"""Deliveries: every displayed message, to every channel of its group, once.

``record_deliveries`` runs inside the transaction that stores a message (the
pipeline, ingest, the sweeper's notes): one ``deliveries`` row per channel
attached to the group, ``pending`` and due now, except the channel the
message came in on (a person's message is mirrored to the *other* channels).
Messages channels do not show (superseded, stored-only records such as
``tool_use`` and ``thinking``) get none.

After the commit the writer signals a deliverer, which claims, sends and
finishes the rows (``orchestrator/run/outbound.py``); the states are
:data:`DeliveryState`: ``pending``, ``sending``, ``sent``, ``failed`` and
``cancelled``, checked as a row is read (``store/stored_literals.py``).

Per (chat, channel) the oldest unfinished row goes first (a later one is not
claimable while an earlier one is pending or sending), so each channel shows
a chat in seq order.  A claim that outlives ``delivery_claim_s`` means its
deliverer died mid-send: the sweeper marks it ``failed`` rather than risk a
second copy (at most once).  The claim's deadline (``claimed_until``) is
written and compared on the database's clock, so a deliverer whose clock is
off never has a live claim abandoned (nor a dead one kept); when a row falls
due (``next_attempt_at``) is the writing host's clock, compared with the
reading host's: a skew only moves a send or a retry, never repeats one.

A sent row keeps the channel's ids of its posts (``sent_ids``), which the edits and
retractions of ``orchestrator/store/delivery_changes.py`` name.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Collection
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Annotated, Any, Final, Literal, TypedDict, get_args

from pydantic import BaseModel, ConfigDict
from sqlalchemy import Connection, and_, exists, func, insert, literal_column, select, update
from sqlalchemy.orm import Session, aliased

from orchestrator.core.errors import ChannelError
from orchestrator.core.jsontypes import JsonObject
from orchestrator.model.messages import SENDER_BOT, StoredMessage
from orchestrator.model.render import ORIGIN_CHANNEL_KEY, displayed
from orchestrator.store.claims import CANCELLED as CANCELLED
from orchestrator.store.claims import FAILED as FAILED
from orchestrator.store.claims import PENDING as PENDING
from orchestrator.store.claims import SENDING as SENDING
from orchestrator.store.claims import abandon_stale, claim_row, end_claim, end_values
from orchestrator.store.db import Database, changed_rows, driver_execute
from orchestrator.store.message_log import to_stored
from orchestrator.store.stored_literals import column_check
from orchestrator.store.tables import DeliveryChangeRow, DeliveryRow, GroupRow, MessageRow

log = logging.getLogger(__name__)

DeliveryState = Literal["pending", "sending", "sent", "failed", "cancelled"]
STATES: tuple[DeliveryState, ...] = get_args(DeliveryState)
SENT: Final = "sent"
# Why a send of a message superseded (regenerate, truncate, an edit that reruns) was not made.
SUPERSEDED_UNSENT = "superseded before it was sent"


def utc_now() -> datetime:
    return datetime.now(UTC)


class Delivery(BaseModel):
    model_config = ConfigDict(frozen=True)

    id: int
    message_seq: int
    chat_jid: str
    channel: str
    address: str
    state: Annotated[DeliveryState, column_check(STATES, "deliveries.state")]
    attempts: int
    next_attempt_at: datetime
    last_error: str | None
    created_at: datetime
    sent_at: datetime | None
    # The channel's ids of what it posted (None: not sent, sent before revision 0024, or a
    # channel that keeps none): what an edit or a retraction names.
    sent_ids: list[str] | None = None

    @property
    def reached(self) -> bool:
        """Its send is done: the channel shows it."""
        return self.state == SENT


def _delivery(row: DeliveryRow) -> Delivery:
    return Delivery.model_validate(row, from_attributes=True)


_NAME = re.compile(r"[a-z0-9][a-z0-9_-]{0,63}")


def validate_channel_name(name: str) -> str:
    # fullmatch: a pattern ending in "$" also matches before a final newline ("log\n").
    if not _NAME.fullmatch(name or ""):
        raise ChannelError(f"channel name {name!r} must be 1-64 lowercase letters, digits, '-' or '_'")
    return name


def unfinished(d: type[DeliveryRow] | type[DeliveryChangeRow] | Any) -> Any:
    """``pending`` or ``sending``.  Constants, not parameters: only a predicate that repeats a
    partial index's own (``idx_deliveries_unfinished``, revision 0016;
    ``idx_delivery_changes_unfinished``, 0024) lets either database use the index, and a
    prepared statement's parameters do not."""
    return d.state.in_([literal_column(f"'{PENDING}'"), literal_column(f"'{SENDING}'")])


def claimable(d: type[DeliveryRow] | Any, now: datetime) -> Any:
    """A pending, due row with no earlier unfinished row of its (chat, channel).

    Both halves read the unfinished rows' index, so a claim costs the same
    whatever the line's history (``state = 'pending'`` alone would not tell
    SQLite that the partial index holds the row)."""
    earlier = aliased(DeliveryRow)
    blocked = exists().where(
        earlier.chat_jid == d.chat_jid,
        earlier.channel == d.channel,
        earlier.message_seq < d.message_seq,
        unfinished(earlier),
    )
    return and_(unfinished(d), d.state == PENDING, d.next_attempt_at <= now, ~blocked)


# -- recording (inside the message's transaction) ------------------------------------


_ATTACHED = "SELECT channel, address FROM group_channels WHERE chat_jid = :chat_jid"


class _NewDelivery(TypedDict):
    """A ``deliveries`` row as ``record_deliveries`` inserts it."""

    message_seq: int
    chat_jid: str
    channel: str
    address: str
    state: DeliveryState
    attempts: int
    next_attempt_at: datetime
    created_at: datetime


def attached_channels(conn: Connection, chat_jid: str) -> list[tuple[str, str | None]]:
    """The channels attached to ``chat_jid`` and their addresses, in the caller's transaction:
    read before a message is stored, it is read outside the message-seq lock (a run's outputs)."""
    return [(channel, address) for channel, address in driver_execute(conn, _ATTACHED, {"chat_jid": chat_jid})]


def record_deliveries(
    session: Session | Connection,
    msg: StoredMessage,
    attached: list[tuple[str, str | None]] | None = None,
) -> int:
    """Queue ``msg`` for every channel of its group but the one it came from,
    inside the caller's transaction (an ORM session or a Core connection);
    returns how many.  ``attached``: the group's channels as :func:`attached_channels`
    read them in this transaction; read here if not given."""
    if not displayed(msg):
        return 0
    origin = (msg.metadata or {}).get(ORIGIN_CHANNEL_KEY)
    now = utc_now()
    if attached is None:
        # On every ingest: one fixed statement on the driver (docs/performance.md).
        conn = session.connection() if isinstance(session, Session) else session
        attached = attached_channels(conn, msg.chat_jid)
    rows: list[_NewDelivery] = [
        {
            "message_seq": msg.seq,
            "chat_jid": msg.chat_jid,
            "channel": channel,
            "address": address or msg.chat_jid,
            "state": PENDING,
            "attempts": 0,
            "next_attempt_at": now,
            "created_at": now,
        }
        for channel, address in attached
        if channel != origin
    ]
    if rows:
        session.execute(insert(DeliveryRow), rows)
    return len(rows)


def cancel_pending(
    session: Session,
    *,
    chat_jid: str | None = None,
    channel: str | None = None,
    seqs: list[int] | None = None,
    reason: str,
) -> int:
    """Cancel unsent (pending) deliveries in the caller's transaction."""
    q = update(DeliveryRow).where(DeliveryRow.state == PENDING)
    if chat_jid is not None:
        q = q.where(DeliveryRow.chat_jid == chat_jid)
    if channel is not None:
        q = q.where(DeliveryRow.channel == channel)
    if seqs is not None:
        q = q.where(DeliveryRow.message_seq.in_(seqs))
    return changed_rows(session.execute(q.values(state=CANCELLED, last_error=reason))) or 0


# -- the deliverer's (orchestrator/run/outbound.py) -----------------------------------


def _scoped(
    q: Any,
    chat_jid: str | None,
    channels: Collection[str] | None,
    table: type[DeliveryRow] | type[DeliveryChangeRow] = DeliveryRow,
) -> Any:
    if chat_jid is not None:
        q = q.where(table.chat_jid == chat_jid)
    if channels is not None:
        q = q.where(table.channel.in_(channels))
    return q


def claimable_ids(
    db: Database, *, chat_jid: str | None = None, channels: Collection[str] | None = None, limit: int = 100
) -> list[int]:
    """The ids of the rows :func:`claimable` now (of one chat, on some channels), in seq order."""
    now = utc_now()
    with db.read() as session:
        return list(
            session.scalars(
                _scoped(
                    select(DeliveryRow.id)
                    .where(claimable(DeliveryRow, now))
                    .order_by(DeliveryRow.message_seq)
                    .limit(limit),
                    chat_jid,
                    channels,
                )
            )
        )


def next_retry_at(
    db: Database, *, chat_jid: str | None = None, channels: Collection[str] | None = None
) -> datetime | None:
    """When the next pending row, a send or a change (of one chat, on some channels), that is
    not due yet falls due."""
    now = utc_now()
    found: list[datetime] = []
    with db.read() as session:
        for table in (DeliveryRow, DeliveryChangeRow):
            at = session.scalar(
                _scoped(
                    select(func.min(table.next_attempt_at)).where(table.state == PENDING, table.next_attempt_at > now),
                    chat_jid,
                    channels,
                    table,
                )
            )
            if at is not None:
                found.append(at)
    return min(found, default=None)


def claim(db: Database, delivery_id: int, owner: str, claim_s: float) -> bool:
    """Claim the row for ``owner`` if it is claimable (``pending`` and due -> ``sending``,
    attempts + 1) until ``claim_s`` seconds from the database's now; whether it was."""
    return claim_row(db, DeliveryRow, delivery_id, claimable(DeliveryRow, utc_now()), owner, claim_s)


@dataclass(frozen=True)
class Outgoing:
    """A claimed delivery with what sending it needs."""

    delivery: Delivery
    message: StoredMessage | None  # None: no such message any more
    assistant_name: str | None  # the group's own (None: the settings', or no group)


def outgoing(db: Database, delivery_id: int) -> Outgoing:
    """The delivery ``delivery_id``, its message and its group's assistant name, in one read."""
    with db.read() as session:
        row = session.get(DeliveryRow, delivery_id)
        assert row is not None  # claimed by the caller: rows are never deleted
        msg_row = session.scalar(select(MessageRow).where(MessageRow.seq == row.message_seq))
        group = session.get(GroupRow, row.chat_jid)
        return Outgoing(
            _delivery(row),
            to_stored(msg_row) if msg_row is not None else None,
            group.assistant_name if group is not None else None,
        )


def finish_claim(
    db: Database,
    delivery_id: int,
    owner: str,
    *,
    state: DeliveryState,
    last_error: str | None = None,
    next_attempt_at: datetime | None = None,
    sent_at: datetime | None = None,
    sent_ids: list[str] | None = None,
    give_back_attempt: bool = False,
) -> None:
    """End ``owner``'s claim on the row: ``state``, with the fields given (``give_back_attempt``:
    the claim's attempt is not counted; ``sent_ids``: the channel's ids of its posts).  Only the claim's holder ends it: the sweeper may have
    given up on a slow send meanwhile, and what really happened wins."""
    values = end_values(
        DeliveryRow, state, last_error=last_error, next_attempt_at=next_attempt_at, give_back_attempt=give_back_attempt
    )
    if sent_at is not None:
        values["sent_at"] = sent_at
    if sent_ids is not None:
        values["sent_ids"] = sent_ids
    with db.write() as session:
        end_claim(session, DeliveryRow, delivery_id, owner, values)


# -- reading ------------------------------------------------------------------------


def list_deliveries(
    db: Database,
    *,
    chat_jid: str | None = None,
    state: str | None = None,
    channel: str | None = None,
    message_seq: int | None = None,
    limit: int = 200,
) -> list[Delivery]:
    """Newest first."""
    q = select(DeliveryRow).order_by(DeliveryRow.message_seq.desc(), DeliveryRow.channel).limit(limit)
    for col, value in (
        (DeliveryRow.chat_jid, chat_jid),
        (DeliveryRow.state, state),
        (DeliveryRow.channel, channel),
        (DeliveryRow.message_seq, message_seq),
    ):
        if value is not None:
            q = q.where(col == value)
    with db.read() as session:
        return [_delivery(r) for r in session.scalars(q)]


def bot_reply_sent(db: Database, chat_jid: str, channel: str, address: str, after_seq: int) -> bool:
    """Whether a reply of the assistant's (``bot``) stored after ``after_seq`` has been sent
    to ``address`` on ``channel``: a run's answer is out there."""
    stmt = (
        select(DeliveryRow.id)
        .join(MessageRow, MessageRow.seq == DeliveryRow.message_seq)
        .where(
            DeliveryRow.chat_jid == chat_jid,
            DeliveryRow.channel == channel,
            DeliveryRow.address == address,
            DeliveryRow.state == SENT,
            DeliveryRow.message_seq > after_seq,
            MessageRow.sender == SENDER_BOT,
        )
        .limit(1)
    )
    with db.read() as session:
        return session.scalar(stmt) is not None


def due_chats(db: Database) -> list[str]:
    """Chats with a pending delivery, or a pending change to one, that is due now."""
    now = utc_now()
    with db.read() as session:
        return sorted(
            {
                jid
                for table in (DeliveryRow, DeliveryChangeRow)
                for jid in session.scalars(
                    select(table.chat_jid).where(table.state == PENDING, table.next_attempt_at <= now).distinct()
                )
            }
        )


def abandon_stale_claims(db: Database, resend: Collection[str] = ()) -> int:
    """Claims past their deadline, of sends and of changes to them: the deliverer died
    mid-call, so whether the receiver got it is unknown.  On the ``resend`` channels (whose
    receivers deduplicate by the delivery id) it is made again, at once; on the others it
    is marked failed, never repeated, so that it is never shown twice
    (``orchestrator/store/claims.py``).  Returns how many claims were ended."""
    # Deadlines are written on the database's clock (run/outbound.py) and compared with it.
    with db.write() as session:
        return sum(abandon_stale(session, t, resend, again_at=utc_now()) for t in (DeliveryRow, DeliveryChangeRow))


def with_origin(metadata: JsonObject | None, channel: str | None) -> JsonObject | None:
    """``metadata`` naming the channel a message arrived on (unchanged without one)."""
    if channel is None:
        return metadata
    return {**(metadata or {}), ORIGIN_CHANNEL_KEY: validate_channel_name(channel)}
