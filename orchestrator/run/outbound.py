"""The outbound port: channels by name, and the deliverer that works the ledger.

The run path knows channels only through :class:`Channel`; the adapters
(``orchestrator/channels/``) implement it and ``orchestrator.channels.registry``
builds the registry a process sends on.

The ledger itself (a row per message and channel, recorded with the message)
is ``orchestrator/store/deliveries.py``.  A :class:`Deliverer` works it: the
``deliver`` Celery task on the ``delivery`` queue (workers), or one in the
same process (tests, ``orchestrator deliveries flush``).  It claims one row at
a time with a conditional UPDATE (``pending`` and due -> ``sending``,
attempts + 1, its name and a claim deadline), so two deliverers never send
the same row, then renders the message and sends it:

* success: ``sent`` with ``sent_at``;
* failure: back to ``pending`` after the backoff policy's delay
  (``orchestrator/core/backoff.py``; at least a rate-limited channel's
  ``Retry-After``, :class:`~orchestrator.core.errors.ChannelRateLimited`), or ``failed`` after
  ``delivery_max_attempts``; ``last_error`` keeps the reason.  A rate-limited send
  uses up no attempt: a long rate limit delays a message, never fails it;
* the message was superseded meanwhile, or the channel detached: ``cancelled``.

The channel's ids of what it posted (what ``send`` returns) are kept on the row.  Each
round first makes the due edits and retractions of sent rows that history changes
recorded (``orchestrator/run/outbound_changes.py``).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from datetime import datetime
from typing import Protocol, runtime_checkable

from agent_runner.protocol import Reaction
from orchestrator.core import metrics
from orchestrator.core.errors import ChannelError
from orchestrator.core.settings import Settings
from orchestrator.model.messages import SENDER_BOT, StoredMessage
from orchestrator.model.render import RenderedMessage, displayed, render
from orchestrator.model.views import REPLY_TO_KEY
from orchestrator.run.outbound_changes import ChangeSender
from orchestrator.run.send_failure import judge_failure
from orchestrator.store.db import Database
from orchestrator.store.deliveries import (
    CANCELLED,
    FAILED,
    PENDING,
    SENT,
    SUPERSEDED_UNSENT,
    Delivery,
    DeliveryState,
    claim,
    claimable_ids,
    finish_claim,
    next_retry_at,
    outgoing,
    utc_now,
    validate_channel_name,
)
from orchestrator.store.delivery_changes import take_over_posts
from orchestrator.store.hosts import process_owner

log = logging.getLogger(__name__)


@runtime_checkable
class Channel(Protocol):
    name: str

    def connect(self) -> None: ...

    def disconnect(self) -> None: ...

    def owns(self, address: str) -> bool:
        """Whether this channel can reach ``address`` (a URL, a Telegram chat id; by default the chat's jid)."""
        ...

    def send(self, address: str, rendered: RenderedMessage) -> list[str] | None:
        """Show ``rendered`` at ``address``; raise on failure (the deliverer retries).  Returns
        the channel's own ids of what it posted (one per post), kept in the ledger for
        :meth:`edit` and :meth:`retract` (None: nothing to keep)."""
        ...

    def edit(self, address: str, posted: list[str], rendered: RenderedMessage) -> list[str]:
        """Show ``rendered`` instead of the posts ``posted`` (in place where the channel can,
        else taken back and sent again); the ids of its posts now.  Raises on failure."""
        ...

    def retract(self, address: str, posted: list[str], rendered: RenderedMessage) -> None:
        """Take back the posts ``posted`` of the message ``rendered``.  Raises on failure."""
        ...

    def react(self, address: str, posted: list[str], rendered: RenderedMessage, reaction: Reaction) -> bool:
        """Put ``reaction`` on the message shown as ``posted``; False: the channel cannot show
        it.  Raises on failure."""
        ...

    def origin_post(self, address: str, message_id: str) -> str | None:
        """The channel's own id of the post a person's message came from, or None."""
        ...


class ChannelRegistry:
    """The channels this process can send on, by name."""

    def resent_after_crash(self) -> list[str]:
        """The channels whose sends cut short by a deliverer's death are sent again
        (``resend_after_crash``: the receiver deduplicates by the delivery id)."""
        return [name for name, ch in self._channels.items() if getattr(ch, "resend_after_crash", False)]

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

    def reaching(self, name: str, address: str) -> Channel:
        """The channel ``name``, which must be here and reach ``address``; raises ChannelError."""
        channel = self.get(name)
        if channel is None:
            raise ChannelError(f"no channel named {name!r} here (known: {', '.join(self.names)})")
        if not channel.owns(address):
            raise ChannelError(f"channel {name!r} cannot reach {address!r}")
        return channel

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
            except Exception:  # closing the others matters more
                log.exception("channel %s did not disconnect cleanly", ch.name)


# -- sending ------------------------------------------------------------------------


@dataclass
class DeliveryReport:
    sent: int = 0
    failed_attempts: int = 0  # sends and changes that raised (retried later, or failed for good)
    cancelled: int = 0
    changed: int = 0  # edits and retractions made (orchestrator/run/outbound_changes.py)
    retry_in: float | None = None  # seconds until the next pending delivery in scope is due


class Deliverer:
    """Sends due deliveries on the channels of ``registry``.

    ``only_known``: leave rows for channels this process does not have to
    another process (tests, the CLI); a worker passes False, so a channel no
    worker has fails (with retries) instead of waiting forever.
    """

    def __init__(
        self,
        db: Database,
        settings: Settings,
        registry: ChannelRegistry,
        *,
        owner: str | None = None,
        only_known: bool = True,
    ) -> None:
        self.db, self.settings, self.registry = db, settings, registry
        self.owner = owner or process_owner(settings.fleet.effective_host_id)
        self.only_known = only_known
        self._changes = ChangeSender(db, settings, registry, self.owner)

    def _channels(self) -> list[str] | None:
        # None: every channel (a worker's: a channel no worker has fails, with retries).
        return self.registry.names if self.only_known else None

    def deliver_due(self, chat_jid: str | None = None) -> DeliveryReport:
        """Send everything due (of one chat, or all); returns what happened."""
        report = DeliveryReport()
        while True:
            # The edits and retractions first: a superseded answer goes before its new one comes.
            changes = self._changes.send_due(chat_jid, self._channels())
            report.changed += changes.changed
            report.failed_attempts += changes.failed_attempts
            report.cancelled += changes.cancelled
            ids = claimable_ids(self.db, chat_jid=chat_jid, channels=self._channels())
            progressed = changes.claimed > 0
            for delivery_id in ids:
                if claim(self.db, delivery_id, self.owner, self.settings.delivery.claim_s):
                    progressed = True
                    self._send(delivery_id, report)
            if not progressed:
                break
        nxt = next_retry_at(self.db, chat_jid=chat_jid, channels=self._channels())
        if nxt is not None:
            report.retry_in = max(0.0, (nxt - utc_now()).total_seconds())
        return report

    def _send(self, delivery_id: int, report: DeliveryReport) -> None:
        out = outgoing(self.db, delivery_id)
        row, msg = out.delivery, out.message
        if msg is None or not displayed(msg):
            report.cancelled += 1
            metrics.delivery_ended(row.channel, "cancelled")
            self._finish(delivery_id, state=CANCELLED, last_error=SUPERSEDED_UNSENT)
            return
        assistant = out.assistant_name or self.settings.assistant_name
        try:
            channel = self.registry.reaching(row.channel, row.address)
            rendered = render(msg, assistant).model_copy(
                update={"delivery_id": f"{self.settings.install_id}-{delivery_id}"}
            )
            taken = row.sent_ids or self._superseded_posts(row, msg)
            posted: list[str] | None
            with metrics.DELIVERY_SECONDS.labels(row.channel).time():
                if taken:
                    # A rerun's reply: shown in place of the one it replaces (as an edit is).
                    posted = channel.edit(row.address, taken, rendered)
                else:
                    posted = channel.send(row.address, rendered)
        except Exception as exc:  # noqa: BLE001 - any channel failure is recorded and retried
            report.failed_attempts += 1
            failed = judge_failure(
                exc,
                attempts=row.attempts,
                delivery=self.settings.delivery,
                what=f"delivery of #{row.message_seq} to {row.channel}",
            )
            self._finish(
                delivery_id,
                state=PENDING if failed.retry_at is not None else FAILED,
                last_error=failed.error,
                next_attempt_at=failed.retry_at,
                give_back_attempt=failed.give_back_attempt,
            )
            metrics.delivery_ended(row.channel, "retried" if failed.retry_at is not None else "failed")
            return
        report.sent += 1
        metrics.delivery_ended(row.channel, "sent")
        self._finish(delivery_id, state=SENT, sent_at=utc_now(), sent_ids=posted)

    def _superseded_posts(self, row: Delivery, msg: StoredMessage) -> list[str] | None:
        """The posts of the agent's reply a rerun's reply ``msg`` takes over on this channel
        (``store/delivery_changes.py``: ``take_over_posts``), if it is one and there is one."""
        reply_to = (msg.metadata or {}).get(REPLY_TO_KEY)
        if msg.part.kind != "assistant_text" or msg.sender != SENDER_BOT or not isinstance(reply_to, int):
            return None
        return take_over_posts(self.db, row, reply_to)

    def _finish(
        self,
        delivery_id: int,
        *,
        state: DeliveryState,
        last_error: str | None = None,
        next_attempt_at: datetime | None = None,
        sent_at: datetime | None = None,
        sent_ids: list[str] | None = None,
        give_back_attempt: bool = False,
    ) -> None:
        # Only the claim's holder ends it (the sweeper may have given up on
        # a slow send meanwhile; what really happened wins).
        finish_claim(
            self.db,
            delivery_id,
            self.owner,
            state=state,
            last_error=last_error,
            next_attempt_at=next_attempt_at,
            sent_at=sent_at,
            sent_ids=sent_ids,
            give_back_attempt=give_back_attempt,
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
