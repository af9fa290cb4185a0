"""The deliverer's side of the changes to what channels show: edits and retractions.

The ledger of changes is ``orchestrator/store/delivery_changes.py`` (what a history change
records); the :class:`~orchestrator.run.outbound.Deliverer` works it with a
:class:`ChangeSender` before the sends of each round.  A change is claimed as a send is
(one deliverer at a time), then made on the channel that showed the message, naming the
posts the ledger kept (``deliveries.sent_ids``):

* ``update``: ``channel.edit`` shows the message as it is now (in place where the channel
  can, else retracted and sent again) and returns the ids of its posts now, which replace
  the ledger's;
* ``retract``: ``channel.retract`` takes the posts back;
* ``react``: ``channel.react`` puts the reaction's emoji on the message's posts (the
  first of its words), or, where a person's message came from (no delivery), on the post
  the channel names for the message's inbound id (``channel.origin_post``).

Each carries a delivery id of its own, the same on every attempt
(``<install id>-<delivery row id>-<kind>-<change row id>``: the webhook's receivers
deduplicate by it).  A failure is retried as a send's is (``orchestrator/run/send_failure.py``).
A change with nothing to do ends ``cancelled`` with the reason: its send never reached the
channel, the channel kept no ids, or (an update) the message was superseded since.
"""

from __future__ import annotations

from collections.abc import Collection
from dataclasses import dataclass
from typing import Any, Protocol

from agent_runner.protocol import Reaction, reaction_of
from orchestrator.core import metrics
from orchestrator.core.settings import Settings
from orchestrator.model.render import RenderedMessage, displayed, render
from orchestrator.run.send_failure import judge_failure
from orchestrator.store.claims import CANCELLED, FAILED, PENDING
from orchestrator.store.db import Database
from orchestrator.store.delivery_changes import (
    DONE,
    REACT,
    RETRACT,
    UPDATE,
    ChangeState,
    DeliveryChange,
    OutgoingChange,
    claim_change,
    finish_change,
    outgoing_change,
    ready_change_ids,
)


class Changing(Protocol):
    """What a change needs of a channel (``orchestrator/run/outbound.py``'s ``Channel`` has it)."""

    def edit(self, address: str, posted: list[str], rendered: RenderedMessage) -> list[str]: ...

    def retract(self, address: str, posted: list[str], rendered: RenderedMessage) -> None: ...

    def react(self, address: str, posted: list[str], rendered: RenderedMessage, reaction: Reaction) -> bool: ...

    def origin_post(self, address: str, message_id: str) -> str | None: ...


class Channels(Protocol):
    """What a change needs of the registry (``ChannelRegistry``)."""

    def reaching(self, name: str, address: str) -> Changing: ...


@dataclass
class ChangeReport:
    claimed: int = 0
    changed: int = 0
    failed_attempts: int = 0  # changes that raised (retried later, or failed for good)
    cancelled: int = 0


def change_delivery_id(install_id: str, change: DeliveryChange) -> str:
    """The change's delivery id: the same on every attempt, never a send's."""
    return f"{install_id}-{change.delivery_id or 'origin'}-{change.kind}-{change.id}"


def moot(out: OutgoingChange) -> str | None:
    """Why the change has nothing to do (None: it has)."""
    sent, msg = out.delivery, out.message
    if sent is not None and not sent.reached:
        return f"its send ended {sent.state}: nothing of it reached the channel"
    if sent is not None and sent.sent_ids is None:
        return "the channel kept no ids of what it posted"
    if msg is None:
        return "its message is gone"
    if out.change.kind == UPDATE and not displayed(msg):
        return "superseded since: retracted instead"
    if out.change.kind == REACT and (out.emoji is None or reaction_of(out.emoji) is None):
        return f"no reaction the channels take: {out.emoji!r}"
    if out.change.kind == REACT and not displayed(msg):
        return "superseded since: not shown any more"
    return None


def _origin_posts(channel: Changing, address: str, message_id: str) -> list[str]:
    """The channel's own post of a person's message that came from it (none: it names none)."""
    post = channel.origin_post(address, message_id)
    return [] if post is None else [post]


class ChangeSender:
    """Makes the due changes on the channels of ``registry`` (see the module's doc)."""

    def __init__(self, db: Database, settings: Settings, registry: Channels, owner: str) -> None:
        self.db, self.settings, self.registry, self.owner = db, settings, registry, owner

    def send_due(self, chat_jid: str | None, channels: Collection[str] | None) -> ChangeReport:
        """Claim and make every change ready now (of one chat, on some channels)."""
        report = ChangeReport()
        for change_id in ready_change_ids(self.db, chat_jid=chat_jid, channels=channels):
            if claim_change(self.db, change_id, self.owner, self.settings.delivery.claim_s):
                report.claimed += 1
                self._make(change_id, report)
        return report

    def _make(self, change_id: int, report: ChangeReport) -> None:
        out = outgoing_change(self.db, change_id)
        change, sent, msg = out.change, out.delivery, out.message
        why = moot(out)
        if why is not None:
            self._finish(change, report, CANCELLED, last_error=why)
            return
        assert msg is not None  # moot says so
        address = sent.address if sent is not None else (change.address or change.chat_jid)
        assistant = out.assistant_name or self.settings.assistant_name
        posted: list[str] | None = None
        try:
            channel = self.registry.reaching(change.channel, address)
            rendered = render(msg, assistant).model_copy(
                update={"delivery_id": change_delivery_id(self.settings.install_id, change)}
            )
            if change.kind == REACT:
                reaction = reaction_of(out.emoji or "")
                assert reaction is not None  # moot says so
                posts = list(sent.sent_ids or []) if sent is not None else _origin_posts(channel, address, msg.id)
                if not posts:
                    why = f"{change.channel} keeps no post of its own for message {msg.id!r}"
                elif not channel.react(address, posts, rendered, reaction):
                    why = f"{change.channel} cannot show {reaction.emoji}"
            elif change.kind == RETRACT:
                assert sent is not None and sent.sent_ids is not None  # moot says so
                channel.retract(address, list(sent.sent_ids), rendered)
            else:
                assert sent is not None and sent.sent_ids is not None  # moot says so
                posted = channel.edit(address, list(sent.sent_ids), rendered)
        except Exception as exc:  # noqa: BLE001 - any channel failure is recorded and retried
            what = {UPDATE: "edit", RETRACT: "retraction", REACT: "reaction"}[change.kind]
            failed = judge_failure(
                exc,
                attempts=change.attempts,
                delivery=self.settings.delivery,
                what=f"{what} of #{change.message_seq} on {change.channel}",
            )
            self._finish(
                change,
                report,
                PENDING if failed.retry_at is not None else FAILED,
                last_error=failed.error,
                next_attempt_at=failed.retry_at,
                give_back_attempt=failed.give_back_attempt,
            )
            return
        if why is not None:
            self._finish(change, report, CANCELLED, last_error=why)
        else:
            self._finish(change, report, DONE, sent_ids=posted)

    def _finish(self, change: DeliveryChange, report: ChangeReport, state: ChangeState, **how: Any) -> None:
        """End the claim on ``change`` as ``state`` (``finish_change``'s ``how``), counted."""
        if state == DONE:
            report.changed += 1
        elif state == CANCELLED:
            report.cancelled += 1
        else:
            report.failed_attempts += 1
        metrics.DELIVERY_CHANGES.labels(channel=change.channel, kind=change.kind, state=state).inc()
        finish_change(self.db, change, self.owner, state=state, **how)
