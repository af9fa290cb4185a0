"""Deliveries: every displayed message, to every channel of its group, once.

``record_deliveries`` runs inside the transaction that stores a message (the
pipeline, ingest, the sweeper's notes): one ``deliveries`` row per channel
attached to the group, ``pending`` and due now, except the channel the
message came in on (a person's message is mirrored to the *other* channels).
Messages channels do not show (superseded, stored-only records such as
``tool_use`` and ``thinking``) get none.

After the commit the writer signals a deliverer: the ``deliver`` Celery task
on the ``delivery`` queue (workers), or a :class:`Deliverer` in the same
process (tests, ``orchestrator deliveries flush``).  A deliverer claims one
row at a time with a conditional UPDATE (``pending`` and due -> ``sending``,
attempts + 1, its name and a claim deadline), so two deliverers never send
the same row, then renders the message and sends it:

* success: ``sent`` with ``sent_at``;
* failure: back to ``pending`` after ``uniform(d/2, d)`` seconds,
  ``d = min(retry_max, retry_base·2ⁿ⁻¹)``, or ``failed`` after
  ``delivery_max_attempts``; ``last_error`` keeps the reason;
* the message was superseded meanwhile, or the channel detached: ``cancelled``.

Per (chat, channel) the oldest unfinished row goes first (a later one is not
claimable while an earlier one is pending or sending), so each channel shows
a chat in seq order.  A claim that outlives ``delivery_claim_s`` means its
deliverer died mid-send: the sweeper marks it ``failed`` rather than risk a
second copy (at most once).
"""

from __future__ import annotations

import logging
import os
import random
import socket
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

from pydantic import BaseModel, ConfigDict
from sqlalchemy import Connection, and_, exists, func, insert, select, update
from sqlalchemy.orm import Session, aliased

from .channels import ChannelRegistry, validate_channel_name
from .db import Database
from .errors import ChannelError
from .messages import StoredMessage
from .render import ORIGIN_CHANNEL_KEY, displayed, render
from .settings import Settings
from .store import driver_execute, to_stored
from .tables import DeliveryRow, GroupRow, MessageRow

log = logging.getLogger(__name__)

PENDING, SENDING, SENT, FAILED, CANCELLED = "pending", "sending", "sent", "failed", "cancelled"
STATES = (PENDING, SENDING, SENT, FAILED, CANCELLED)
_ERROR_CAP = 2000


def _now() -> datetime:
    return datetime.now(UTC)


class Delivery(BaseModel):
    model_config = ConfigDict(frozen=True)

    id: int
    message_seq: int
    chat_jid: str
    channel: str
    address: str
    state: str
    attempts: int
    next_attempt_at: datetime
    last_error: str | None
    created_at: datetime
    sent_at: datetime | None


def _delivery(row: DeliveryRow) -> Delivery:
    return Delivery.model_validate(row, from_attributes=True)


# -- recording (inside the message's transaction) ------------------------------------


_ATTACHED = "SELECT channel, address FROM group_channels WHERE chat_jid = :jid"


def record_deliveries(session: Session | Connection, msg: StoredMessage) -> int:
    """Queue ``msg`` for every channel of its group but the one it came from,
    inside the caller's transaction (an ORM session or a Core connection);
    returns how many."""
    if not displayed(msg):
        return 0
    origin = (msg.metadata or {}).get(ORIGIN_CHANNEL_KEY)
    now = _now()
    # On every ingest: one fixed statement on the driver (docs/performance.md).
    conn = session.connection() if isinstance(session, Session) else session
    attached = driver_execute(conn, _ATTACHED, {"jid": msg.chat_jid}).fetchall()
    rows: list[dict[str, Any]] = [
        {
            "message_seq": msg.seq, "chat_jid": msg.chat_jid, "channel": channel,
            "address": address or msg.chat_jid, "state": PENDING, "attempts": 0,
            "next_attempt_at": now, "created_at": now,
        }
        for channel, address in attached
        if channel != origin
    ]
    if rows:
        session.execute(insert(DeliveryRow), rows)
    return len(rows)


def cancel_pending(
    session: Session, *, chat_jid: str | None = None, channel: str | None = None,
    seqs: list[int] | None = None, reason: str,
) -> int:
    """Cancel unsent (pending) deliveries in the caller's transaction."""
    q = update(DeliveryRow).where(DeliveryRow.state == PENDING)
    if chat_jid is not None:
        q = q.where(DeliveryRow.chat_jid == chat_jid)
    if channel is not None:
        q = q.where(DeliveryRow.channel == channel)
    if seqs is not None:
        q = q.where(DeliveryRow.message_seq.in_(seqs))
    return session.execute(q.values(state=CANCELLED, last_error=reason)).rowcount or 0


# -- reading ------------------------------------------------------------------------


def list_deliveries(
    db: Database, *, chat_jid: str | None = None, state: str | None = None, channel: str | None = None,
    message_seq: int | None = None, limit: int = 200,
) -> list[Delivery]:
    """Newest first."""
    q = select(DeliveryRow).order_by(DeliveryRow.message_seq.desc(), DeliveryRow.channel).limit(limit)
    for col, value in ((DeliveryRow.chat_jid, chat_jid), (DeliveryRow.state, state),
                       (DeliveryRow.channel, channel), (DeliveryRow.message_seq, message_seq)):
        if value is not None:
            q = q.where(col == value)
    with db.read() as session:
        return [_delivery(r) for r in session.scalars(q)]


def due_chats(db: Database) -> list[str]:
    """Chats with a pending delivery that is due now."""
    with db.read() as session:
        return list(session.scalars(
            select(DeliveryRow.chat_jid)
            .where(DeliveryRow.state == PENDING, DeliveryRow.next_attempt_at <= _now())
            .distinct()
        ))


def abandon_stale_claims(db: Database) -> int:
    """Claims past their deadline: the deliverer died mid-send.  Marked failed, never resent."""
    with db.write() as session:
        return session.execute(
            update(DeliveryRow)
            .where(DeliveryRow.state == SENDING, DeliveryRow.claimed_until < _now())
            .values(state=FAILED, last_error="its deliverer stopped while sending; not retried, "
                                             "so that it is never sent twice")
        ).rowcount or 0


def retry_delay(attempt: int, base_s: float, max_s: float) -> float:
    """Exponential backoff with jitter: uniform(d/2, d), d = min(max, base·2ⁿ⁻¹)."""
    d = min(max_s, base_s * 2 ** (attempt - 1))
    return random.uniform(d / 2, d)


# -- sending ------------------------------------------------------------------------


@dataclass
class DeliveryReport:
    sent: int = 0
    failed_attempts: int = 0  # sends that raised (retried later, or failed for good)
    cancelled: int = 0
    retry_in: float | None = None  # seconds until the next pending delivery in scope is due


def _claimable(d: type[DeliveryRow] | Any, now: datetime) -> Any:
    earlier = aliased(DeliveryRow)
    blocked = exists().where(
        earlier.chat_jid == d.chat_jid, earlier.channel == d.channel,
        earlier.message_seq < d.message_seq, earlier.state.in_((PENDING, SENDING)),
    )
    return and_(d.state == PENDING, d.next_attempt_at <= now, ~blocked)


class Deliverer:
    """Sends due deliveries on the channels of ``registry``.

    ``only_known``: leave rows for channels this process does not have to
    another process (tests, the CLI); a worker passes False, so a channel no
    worker has fails (with retries) instead of waiting forever.
    """

    def __init__(
        self, db: Database, settings: Settings, registry: ChannelRegistry, *,
        owner: str | None = None, only_known: bool = True,
    ) -> None:
        self.db, self.settings, self.registry = db, settings, registry
        self.owner = owner or f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:8]}"
        self.only_known = only_known

    def _scope(self, q: Any, chat_jid: str | None) -> Any:
        if chat_jid is not None:
            q = q.where(DeliveryRow.chat_jid == chat_jid)
        if self.only_known:
            q = q.where(DeliveryRow.channel.in_(self.registry.names))
        return q

    def deliver_due(self, chat_jid: str | None = None) -> DeliveryReport:
        """Send everything due (of one chat, or all); returns what happened."""
        report = DeliveryReport()
        while True:
            now = _now()
            with self.db.read() as session:
                ids = list(session.scalars(self._scope(
                    select(DeliveryRow.id).where(_claimable(DeliveryRow, now))
                    .order_by(DeliveryRow.message_seq).limit(100), chat_jid,
                )))
            progressed = False
            for delivery_id in ids:
                if self._claim(delivery_id):
                    progressed = True
                    self._send(delivery_id, report)
            if not progressed:
                break
        with self.db.read() as session:
            nxt = session.scalar(self._scope(
                select(func.min(DeliveryRow.next_attempt_at))
                .where(DeliveryRow.state == PENDING, DeliveryRow.next_attempt_at > _now()), chat_jid,
            ))
        if nxt is not None:
            report.retry_in = max(0.0, (nxt - _now()).total_seconds())
        return report

    def _claim(self, delivery_id: int) -> bool:
        now = _now()
        with self.db.write() as session:
            done = session.execute(
                update(DeliveryRow)
                .where(DeliveryRow.id == delivery_id, _claimable(DeliveryRow, now))
                .values(state=SENDING, attempts=DeliveryRow.attempts + 1, claimed_by=self.owner,
                        claimed_until=now + timedelta(seconds=self.settings.delivery_claim_s))
            )
            return done.rowcount == 1

    def _send(self, delivery_id: int, report: DeliveryReport) -> None:
        with self.db.read() as session:
            row = session.get(DeliveryRow, delivery_id)
            assert row is not None
            msg_row = session.scalar(select(MessageRow).where(MessageRow.seq == row.message_seq))
            group = session.get(GroupRow, row.chat_jid)
            msg = to_stored(msg_row) if msg_row is not None else None
        if msg is None or not displayed(msg):
            report.cancelled += 1
            self._finish(delivery_id, state=CANCELLED, last_error="superseded before it was sent")
            return
        assistant = (group.assistant_name if group else None) or self.settings.assistant_name
        try:
            channel = self.registry.get(row.channel)
            if channel is None:
                raise ChannelError(f"no channel named {row.channel!r} here (known: {', '.join(self.registry.names)})")
            if not channel.owns(row.address):
                raise ChannelError(f"channel {row.channel!r} cannot reach {row.address!r}")
            channel.send(row.address, render(msg, assistant))
        except Exception as exc:  # noqa: BLE001 - any channel failure is recorded and retried
            report.failed_attempts += 1
            error = f"{type(exc).__name__}: {exc}"[:_ERROR_CAP]
            if row.attempts >= self.settings.delivery_max_attempts:
                log.warning("delivery of #%d to %s failed for good after %d attempts: %s",
                            row.message_seq, row.channel, row.attempts, error)
                self._finish(delivery_id, state=FAILED, last_error=error)
            else:
                delay = retry_delay(row.attempts, self.settings.delivery_retry_base_s,
                                    self.settings.delivery_retry_max_s)
                log.info("delivery of #%d to %s failed (attempt %d: %s); retrying in %.1fs",
                         row.message_seq, row.channel, row.attempts, error, delay)
                self._finish(delivery_id, state=PENDING, last_error=error,
                             next_attempt_at=_now() + timedelta(seconds=delay))
            return
        report.sent += 1
        self._finish(delivery_id, state=SENT, sent_at=_now())

    def _finish(self, delivery_id: int, **values: Any) -> None:
        # Only the claim's holder ends it (the sweeper may have given up on
        # a slow send meanwhile; what really happened wins).
        with self.db.write() as session:
            session.execute(
                update(DeliveryRow)
                .where(DeliveryRow.id == delivery_id, DeliveryRow.claimed_by == self.owner)
                .values(claimed_by=None, claimed_until=None, **values)
            )

    def deliver_and_reschedule(
        self, chat_jid: str | None, resignal: Callable[[str | None, float], object]
    ) -> DeliveryReport:
        """What the worker's task does: send what is due, then ask to be called
        again when the next retry of this chat falls due."""
        report = self.deliver_due(chat_jid)
        # Only a task whose send failed schedules the retry it set (a task
        # that found the line held up by that retry leaves it alone), so
        # signals do not multiply while a channel is down.
        if report.failed_attempts and report.retry_in is not None:
            try:
                resignal(chat_jid, report.retry_in + 0.1)  # not a moment early
            except Exception as exc:  # noqa: BLE001 - the sweeper re-signals due deliveries
                log.warning("could not schedule the next delivery attempt for %s (%s)", chat_jid, exc)
        return report


def with_origin(metadata: dict[str, Any] | None, channel: str | None) -> dict[str, Any] | None:
    """``metadata`` naming the channel a message arrived on (unchanged without one)."""
    if channel is None:
        return metadata
    return {**(metadata or {}), ORIGIN_CHANNEL_KEY: validate_channel_name(channel)}
