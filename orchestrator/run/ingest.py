"""Ingest: the one path every incoming message takes.

Store the message and mark the group's pending work in ONE transaction, then,
only after the commit, signal a worker (only when the group was idle: see
:func:`ingest`).  A crash between commit and signal loses nothing: the
pending mark is in the database and the sweeper re-signals it.  A sender
over its rate (``ORCHESTRATOR_SENDER_MESSAGES_PER_MINUTE``) is refused
before anything is stored (:class:`~orchestrator.core.errors.RateLimited`).

A chat that is no registered group (a Telegram chat or Slack channel no group is
attached to, a webhook or API post for any chat when registration is not
required) never wakes an agent, and what it stores is bounded here, for every
channel alike (:func:`_bound_unregistered`):

* at most ``ORCHESTRATOR_UNREGISTERED_CHATS`` such chats are kept: the first
  message of one more is not stored (:class:`~orchestrator.core.errors.UnregisteredChatsFull`,
  counted by ``orchestrator_unregistered_messages_dropped_total``, logged once per
  chat), and neither is any later one of it, until a group is registered;
* a kept one holds its ``ORCHESTRATOR_UNREGISTERED_CHAT_MESSAGES`` newest messages:
  each new one deletes the oldest past them, so a chat registered later starts
  with its recent messages as context rather than none or all.

Both are decided under the write lock the insert holds (SQLite's, or the
message-seq lock on PostgreSQL), so concurrent first messages of new chats
cannot pass the cap together.  A registered chat pays nothing for them.
"""

from __future__ import annotations

import logging
import threading
from collections import OrderedDict
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from pydantic import BaseModel, ConfigDict, Field

from orchestrator.core import metrics, tracing
from orchestrator.core.errors import RateLimited, UnregisteredChatsFull
from orchestrator.core.jsontypes import JsonBool, JsonObject
from orchestrator.core.settings import Settings
from orchestrator.model.envelopes import refuse_host_envelope
from orchestrator.model.messages import HARNESS_SENDER_TYPES, SENDER_SCHEDULER, MessageType, NewMessage, StoredMessage
from orchestrator.run import questions
from orchestrator.run.queue import signal_group
from orchestrator.run.router import group_names, trigger_pattern, wakes
from orchestrator.store import unregistered
from orchestrator.store.db import Connection, Database, unavailable_reason
from orchestrator.store.deliveries import record_deliveries, with_origin
from orchestrator.store.file_refs import checked_files
from orchestrator.store.groups import Routing, mark_pending, routing
from orchestrator.store.message_log import insert_message, new_message_id, now_iso
from orchestrator.store.questions import open_question_of
from orchestrator.store.traces import record_trace
from orchestrator.store.usage import record_sender_message, sender_retry_after

log = logging.getLogger(__name__)

Signal = Callable[[str], object]


NO_NUL = r"^[^\x00]*$"


class IncomingMessage(BaseModel):
    """A message as a channel hands it in (validated at the boundary)."""

    model_config = ConfigDict(extra="forbid")

    # No NUL in what the store keys on (neither database keeps one); the patterns put
    # the store's refusal in the API's document.
    chat_jid: str = Field(min_length=1, pattern=NO_NUL)
    sender: str = Field(min_length=1, pattern=NO_NUL)
    sender_name: str = ""
    content: str
    id: str | None = Field(default=None, pattern=NO_NUL)
    # Checked by the store (datetime.fromisoformat); RFC 3339 is what clients should send.  None: now.
    timestamp: str | None = Field(default=None, min_length=1, json_schema_extra={"format": "date-time"})
    is_from_me: JsonBool = False
    message_type: MessageType = "user"
    metadata: JsonObject | None = None
    # The channel it arrived on: mirrored to the group's other channels, not back.
    channel: str | None = Field(default=None, pattern=r"^[a-z0-9][a-z0-9_-]{0,63}$")


class IngestResult(BaseModel):
    message: StoredMessage
    created: bool
    triggered: bool
    # A signal was sent for this message.  False for a triggering message
    # when the group already had pending work: the signal already on its way
    # (or the draining worker) covers this message too.
    signalled: bool


# Chats already logged as dropped, per process (the newest ones; a flood of new chats
# must not grow it nor flood the log).
_DROPPED_LOGGED: OrderedDict[str, None] = OrderedDict()
_DROPPED_LOGGED_MAX = 10_000
_dropped_lock = threading.Lock()


def rate_limited_sender(new: NewMessage) -> bool:
    """Whether ``ORCHESTRATOR_SENDER_MESSAGES_PER_MINUTE`` applies to ``new``: a person's
    message, not the harness's own (bot, host, system, deploy, ...) nor one marked as ours."""
    return (
        not new.is_from_me
        and new.sender not in HARNESS_SENDER_TYPES
        and not ("\x00" in new.sender or "\x00" in new.chat_jid)
    )  # refused by the store as they are


def ingest(
    db: Database,
    settings: Settings,
    incoming: IncomingMessage,
    *,
    signal: Signal | None,
    wake: bool | None = None,
    signal_delivery: Signal | None = None,
    on_stored: Callable[[StoredMessage, bool], object] | None = None,
) -> IngestResult:
    """Store ``incoming``; if it wakes the agent, mark pending work and signal.

    ``wake`` overrides the routing rules (a scheduled task wakes its group
    whatever the trigger setting); it still needs a registered group.
    ``signal_delivery`` is told the chat when the message is queued for its
    group's channels (``orchestrator/store/deliveries.py``).  ``on_stored`` is told
    the stored message and whether it wakes the agent once it is committed,
    before any signal (the CLI says "stored #N" before a reply can arrive).

    With ``ORCHESTRATOR_SENDER_MESSAGES_PER_MINUTE`` set, a person who
    already sent that many messages into the chat in the last minute (the
    database's clock; ``orchestrator/store/usage.py``) is refused with
    :class:`RateLimited` (``retry_after_s``) and nothing is stored; the same
    message id again is still answered as the duplicate it is.

    Only a group that goes from idle to pending is signalled.  If the group
    already had pending work (``pending_seq > cursor_seq`` when our mark
    lands), a signal for it is on its way or a worker is draining it, and
    either one reads ``pending_seq`` again before it lets go: the drain loop
    runs while ``pending_seq > cursor_seq``, re-reads it after each run and
    once more after releasing the lease, and the worker's cursor update
    queues behind our row lock (PostgreSQL) or write lock (SQLite), so it
    cannot slip between our decision and our commit.  A signal that was lost
    (broker down, worker killed) is re-sent by the sweeper, as before.

    With tracing on, each message is an ``ingest`` span (a new trace unless a span is
    current), the signal its child, and a message that wakes the agent keeps the span's
    ``traceparent`` (``orchestrator/store/traces.py``): the trace its run joins.
    """
    if not tracing.enabled():
        return _ingest(
            db, settings, incoming, signal=signal, wake=wake, signal_delivery=signal_delivery, on_stored=on_stored
        )
    with tracing.span(
        "ingest", attributes={"orchestrator.chat_jid": incoming.chat_jid, "orchestrator.sender": incoming.sender}
    ):
        result = _ingest(
            db, settings, incoming, signal=signal, wake=wake, signal_delivery=signal_delivery, on_stored=on_stored
        )
        tracing.annotate(
            message_id=result.message.id,
            seq=result.message.seq,
            created=result.created,
            triggered=result.triggered,
            signalled=result.signalled,
        )
        return result


def ingest_batch(
    db: Database,
    settings: Settings,
    incoming: Sequence[IncomingMessage],
    *,
    signal: Signal | None,
    signal_delivery: Signal | None = None,
) -> list[IngestResult | Exception]:
    """Each of ``incoming`` as :func:`ingest` would store it, one after another in
    that order, in ONE transaction (a group commit): what concurrent posts to
    the API share (``orchestrator/http/write_batches.py``), one BEGIN, one seq lock
    and one COMMIT for all, where each message alone pays its own.

    Each message's outcome, in order: its result, or the exception :func:`ingest`
    raises for it (a sender over its rate, a message the store refuses, the
    database unavailable).  When any message fails, the batch's transaction
    is rolled back whole and each message is ingested again on its own, so one
    message's failure never costs another's storing, nor stores half a batch;
    but when the database itself cannot serve (locked past the wait, restarting,
    its disk full) every message gets that error at once, without a second wait.
    Signals go out after the commit, as :func:`ingest` sends them.
    """
    if len(incoming) == 1 or tracing.enabled():  # a span per message: each its own ingest
        return _one_by_one(db, settings, incoming, signal=signal, signal_delivery=signal_delivery)
    prepared = [_prepare(settings, m) for m in incoming]
    try:
        with db.engine.begin() as conn:
            stored = [
                _store(conn, db, settings, m, new, rate, wake=None)
                for m, (new, rate) in zip(incoming, prepared, strict=True)
            ]
    except Exception as exc:  # noqa: BLE001 - each message again on its own: only the failing one fails
        if unavailable_reason(exc) is not None:
            return [exc] * len(incoming)  # the database's state, not a message's: each would wait again
        return _one_by_one(db, settings, incoming, signal=signal, signal_delivery=signal_delivery)
    return [
        _announce(m, one, signal=signal, signal_delivery=signal_delivery, on_stored=None)
        for m, one in zip(incoming, stored, strict=True)
    ]


def _one_by_one(
    db: Database,
    settings: Settings,
    incoming: Sequence[IncomingMessage],
    *,
    signal: Signal | None,
    signal_delivery: Signal | None,
) -> list[IngestResult | Exception]:
    outcomes: list[IngestResult | Exception] = []
    for message in incoming:
        try:
            outcomes.append(ingest(db, settings, message, signal=signal, signal_delivery=signal_delivery))
        except Exception as exc:  # noqa: BLE001 - the caller answers each message with its own outcome
            outcomes.append(exc)
    return outcomes


def _ingest(
    db: Database,
    settings: Settings,
    incoming: IncomingMessage,
    *,
    signal: Signal | None,
    wake: bool | None,
    signal_delivery: Signal | None,
    on_stored: Callable[[StoredMessage, bool], object] | None,
) -> IngestResult:
    new, rate = _prepare(settings, incoming)
    # A Core connection, not an ORM session: this is the hot path
    # (docs/performance.md).  On SQLite it begins IMMEDIATE like db.write().
    try:
        with db.engine.begin() as conn:
            stored = _store(conn, db, settings, incoming, new, rate, wake=wake)
    except RateLimited:
        # Counted here, where the refusal is final (a batch that met it is tried again one by one).
        metrics.SENDER_REFUSALS.inc()
        raise
    except UnregisteredChatsFull as exc:
        _dropped(exc)
        raise
    return _announce(incoming, stored, signal=signal, signal_delivery=signal_delivery, on_stored=on_stored)


@dataclass(slots=True)
class _Stored:
    """What one message's share of an ingest transaction decided."""

    msg: StoredMessage
    created: bool
    triggered: bool = False
    needs_signal: bool = False
    place: str | None = None
    queued: int = 0


def _prepare(settings: Settings, incoming: IncomingMessage) -> tuple[NewMessage, int]:
    """The message to store, and the sender rate that applies to it (0: none)."""
    new = NewMessage(
        id=incoming.id or new_message_id(),
        timestamp=incoming.timestamp or now_iso(),
        **incoming.model_dump(exclude={"id", "timestamp", "channel", "metadata"}),
        metadata=with_origin(incoming.metadata, incoming.channel),
    )
    # 0 (the default): nothing of the rate limit runs, not one statement.
    rate = settings.quotas.sender_messages_per_minute
    if rate and not rate_limited_sender(new):
        rate = 0
    return new, rate


def _store(
    conn: Connection,
    db: Database,
    settings: Settings,
    incoming: IncomingMessage,
    new: NewMessage,
    rate: int,
    *,
    wake: bool | None,
) -> _Stored:
    """One message's statements inside the caller's ingest transaction."""
    if rate:
        retry_after = sender_retry_after(
            conn, db, chat_jid=new.chat_jid, sender=new.sender, message_id=new.id, limit=rate
        )
        if retry_after is not None:
            raise RateLimited(new.sender, rate, retry_after)  # rolls back: nothing stored
    # Only the host asks questions; a message's files must be its chat's own (what it says of
    # them is replaced by the store's).
    refuse_host_envelope(new.metadata)
    checked = checked_files(conn, new.chat_jid, new.metadata)
    if checked is not new.metadata:
        new = new.model_copy(update={"metadata": checked})
    msg, created = insert_message(conn, db, new)
    out = _Stored(msg, created)
    if not created:
        return out
    if rate:
        record_sender_message(conn, db, chat_jid=new.chat_jid, sender=new.sender)
    out.queued = record_deliveries(conn, msg)
    # Read the group inside the same transaction as the insert (its row locked on PostgreSQL).
    group = routing(conn, incoming.chat_jid)
    if group is None:
        out.triggered = False
        _bound_unregistered(conn, settings, msg)
    elif wake is None:
        out.triggered = wakes(
            msg,
            is_main=group.is_main,
            requires_trigger=group.requires_trigger,
            # A group's own trigger names replace the installation's.
            names=group_names(settings.trigger_names, group.assistant_name, group.trigger_names),
        )
    else:
        out.triggered = wake
    if group is not None and group.open_question is not None and _an_input(msg):
        _meet_question(conn, db, settings, group, msg, incoming.channel, out)
    if out.triggered:
        assert group is not None  # only a registered group wakes the agent
        mark_pending(conn, incoming.chat_jid, msg.seq)
        trace = tracing.traceparent()  # "" while tracing is off: no statement
        if trace:
            record_trace(conn, msg.seq, trace)
        out.place = group.place
        out.needs_signal = group.pending_seq <= group.cursor_seq
    return out


def _an_input(msg: StoredMessage) -> bool:
    """A user message that is no harness record: a person's, or a scheduled task's prompt."""
    return msg.part.kind == "user_text" and not msg.is_from_me and msg.sender not in HARNESS_SENDER_TYPES


def _meet_question(
    conn: Connection,
    db: Database,
    settings: Settings,
    group: Routing,
    msg: StoredMessage,
    channel: str | None,
    out: _Stored,
) -> None:
    """A person's message (or a scheduled task's prompt) while the group has an open question:
    a person's is an answer when it names an option and its sender may answer (it wakes the
    group); else, when it wakes the group anyway, the question expires (``run/questions.py``).
    A scheduled prompt answers nothing: its words are the operator's, not the chat's."""
    question = open_question_of(conn, msg.chat_jid)
    if question is None:
        return
    names = group_names(settings.trigger_names, group.assistant_name, group.trigger_names)
    said = trigger_pattern(names).sub("", msg.content, count=1) if names else msg.content
    choice = questions.parse_choice(question, said)
    person = msg.sender != SENDER_SCHEDULER
    if person and choice is not None and questions.may_answer(group.approvers, msg.sender):
        answered = questions.answer_in(
            conn,
            db,
            question,
            choice,
            by=msg.sender,
            by_name=msg.sender_name,
            via=channel or "reply",
            approvers=group.approvers,
        )
        out.queued += answered.queued
        out.triggered = True
    elif out.triggered:
        expired = questions.expire_in(conn, db, question, "a newer message came before an answer")
        if expired is not None:
            out.queued += expired[1]


def _bound_unregistered(conn: Connection, settings: Settings, msg: StoredMessage) -> None:
    """Inside the ingest transaction, after ``msg`` (of a chat that is no registered group) was
    inserted: refuse it if its chat is new and the cap is reached (the caller's transaction rolls
    back: nothing stored), else keep the chat's newest messages only (see the module's doc)."""
    cap, window = settings.quotas.unregistered_chats, settings.quotas.unregistered_chat_messages
    if cap and not unregistered.kept_before(conn, msg.chat_jid, msg.seq):
        if unregistered.other_unregistered_chats(conn, msg.chat_jid, cap) >= cap:
            raise UnregisteredChatsFull(msg.chat_jid, cap)
    if window:
        unregistered.keep_newest(conn, msg.chat_jid, window)


def _dropped(exc: UnregisteredChatsFull) -> None:
    """A message of an unregistered chat past the cap: counted, and logged once per chat."""
    metrics.UNREGISTERED_DROPS.inc()
    with _dropped_lock:
        if exc.chat_jid in _DROPPED_LOGGED:
            return
        _DROPPED_LOGGED[exc.chat_jid] = None
        while len(_DROPPED_LOGGED) > _DROPPED_LOGGED_MAX:
            _DROPPED_LOGGED.popitem(last=False)
    log.warning(
        "chat %r is no registered group and %d unregistered chats are kept already "
        "(ORCHESTRATOR_UNREGISTERED_CHATS): its messages are not stored (logged once per chat; "
        "counted in orchestrator_unregistered_messages_dropped_total); register it to take them",
        exc.chat_jid,
        exc.limit,
    )


def _announce(
    incoming: IncomingMessage,
    stored: _Stored,
    *,
    signal: Signal | None,
    signal_delivery: Signal | None,
    on_stored: Callable[[StoredMessage, bool], object] | None,
) -> IngestResult:
    """After the commit: the metrics, ``on_stored``, and the signals the message needs."""
    if stored.created:
        metrics.message_ingested(stored.triggered)
    if on_stored is not None:
        on_stored(stored.msg, stored.triggered)
    signalled = False
    if stored.needs_signal and signal is not None:
        try:
            signal_group(signal, incoming.chat_jid, stored.place)
            signalled = True
        except Exception as exc:  # noqa: BLE001 - the broker is down, the work is not lost
            # The message and its pending mark are committed; the sweeper
            # re-signals the group once the broker is back.
            log.warning("could not signal a worker for %s (%s); the sweeper will", incoming.chat_jid, exc)
    if stored.queued and signal_delivery is not None:
        try:
            signal_delivery(incoming.chat_jid)
        except Exception as exc:  # noqa: BLE001 - the sweeper re-signals due deliveries
            log.warning("could not signal a deliverer for %s (%s); the sweeper will", incoming.chat_jid, exc)
    return IngestResult(message=stored.msg, created=stored.created, triggered=stored.triggered, signalled=signalled)
