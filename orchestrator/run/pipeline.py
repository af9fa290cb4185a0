"""The run pipeline: a group's pending work, one attempt at a time.

``Pipeline.step`` is what the Celery task calls.  It takes the group's lease
(so a duplicate or late signal just returns) and makes one attempt at one
run: a new run over everything after the cursor (build the model's view,
start the container, store and deliver each event as it streams, then
advance the cursor), or the next attempt of a run that failed and was
parked until its retry is due.  A failed attempt that may be retried parks
its run (``queued``, ``retry_at``, no lease held) instead of sleeping in the
worker's slot; the task signals the group again with a countdown for it,
and at once when more work is pending.  ``drain_group`` loops over steps
for callers without a task queue.
"""

from __future__ import annotations

import contextlib
import logging
import shutil
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field, replace
from datetime import datetime, timedelta
from typing import NamedTuple

import msgspec

from agent_runner.protocol import (
    AssistantEvent,
    ContainerInput,
    ErrorEvent,
    ModelSettings,
    ProtocolError,
    ResultEvent,
    SendMessageEvent,
    TextDeltaEvent,
    Usage,
    decode_input,
    parse_event,
)
from orchestrator.core import metrics, tracing
from orchestrator.core.backoff import backoff_delay
from orchestrator.core.clock import SYSTEM_CLOCK, Clock
from orchestrator.core.errors import ConfigError, LeaseLost, MountRefused
from orchestrator.core.logs import log_context
from orchestrator.core.settings import Settings
from orchestrator.model.messages import SENDER_BOT, STORED_ONLY_SENDERS, NewMessage, StoredMessage
from orchestrator.model.views import REPLY_TO_KEY, RUN_ID_KEY
from orchestrator.run.assembly import (
    Batch,
    build_input,
    input_bytes,
    plan_batch,
    prior_messages,
    record_input,
    stored_input,
)
from orchestrator.run.live_draft import FREE_LINES_PER_EVENT, LiveDraft
from orchestrator.run.notices import compute_notices
from orchestrator.run.outbound import ChannelRegistry, Deliverer
from orchestrator.run.outputs import OutputMessage, event_to_message, host_message, stored_size
from orchestrator.run.result_meta import result_meta_message
from orchestrator.run.run_trace import run_span
from orchestrator.run.stop_notice import STOP_REASON_LIMITS, Limit, stop_notice
from orchestrator.run.stop_watch import StopWatch
from orchestrator.run.sweeper import recover_group
from orchestrator.sandbox.bounded_io import OutputBudget, OutputLimitExceeded
from orchestrator.sandbox.config import container_plan
from orchestrator.sandbox.containers import GATEWAY_MOUNT, ContainerSpec, DockerSandbox
from orchestrator.sandbox.fencing import hold_for_attempt
from orchestrator.sandbox.gateway import ModelGateway
from orchestrator.sandbox.image import image_name, model_variant
from orchestrator.sandbox.port import Sandbox
from orchestrator.sandbox.sessions import session_mount
from orchestrator.sandbox.warm import WarmPool, gateway_dir, host_only_dir
from orchestrator.store import leases
from orchestrator.store.db import Connection, Database, db_now
from orchestrator.store.deliveries import attached_channels, record_deliveries
from orchestrator.store.groups import Group, get_group, send_refusal, send_targets
from orchestrator.store.hosts import process_owner
from orchestrator.store.message_log import get_messages_after, insert_message, now_iso, waiting_since
from orchestrator.store.replays import run_messages
from orchestrator.store.runs import (
    Run,
    RunState,
    finish_run,
    park_run,
    parked_of,
    resume_run,
    set_container,
    unfinished_runs,
)
from orchestrator.store.slots import FleetFull, SlotWait, leave_line, take_slot, to_wake
from orchestrator.store.usage import QuotaWait, quota_wait, store_quota_notice

log = logging.getLogger(__name__)

GATEWAY_SOCKET = "model.sock"


def model_settings(settings: Settings) -> ModelSettings:
    spec = settings.model.strip()
    if spec == "offline":
        return ModelSettings(provider="offline", model="offline", max_tokens=settings.max_tokens)
    provider, _, model = spec.partition(":")
    if provider == "anthropic" and model:
        thinking = settings.thinking_budget or msgspec.UNSET  # unset: off, and left out of the input
        return ModelSettings(
            provider="anthropic", model=model, max_tokens=settings.max_tokens, thinking_budget=thinking
        )
    if provider == "openai" and model:
        return ModelSettings(provider="openai", model=model, max_tokens=settings.max_tokens)
    if provider == "claude-code" and model:
        return ModelSettings(
            provider="claude-code",
            model=model,
            max_tokens=settings.max_tokens,
            thinking_budget=settings.thinking_budget or msgspec.UNSET,
        )
    raise ConfigError(
        f"ORCHESTRATOR_MODEL={spec!r}: use 'offline', 'anthropic:<model id>', "
        "'openai:<model id>' or 'claude-code:<model id>'"
    )


@dataclass
class Attempt:
    """How one attempt at a run ended."""

    state: RunState
    error: str | None = None
    usage: Usage = field(default_factory=Usage)
    retryable: bool = False
    session_id: str | None = None
    # Another worker took the group over (store/leases.py): this one neither ends
    # the run nor says anything; the new holder closes it (sweeper.recover_group).
    lease_lost: bool = False
    # How the model's side ended (the runner's result), and the limit that stopped
    # the run, if one did (orchestrator/run/stop_notice.py): the chat is told.
    stop_reason: str | None = None
    num_turns: int = 0
    limit: Limit | None = None


@dataclass
class RunSpend:
    """What a run has spent through the model gateway, across its attempts."""

    usage: Usage = field(default_factory=Usage)

    def record(self, gateway: ModelGateway | None) -> None:
        if gateway is not None:
            self.usage = gateway.usage


@dataclass
class Step:
    """What one step did and what the caller should do next."""

    outcome: RunOutcome | None = None  # the run this step attempted (parked or finished)
    more: bool = False  # pending work is left: signal the group again
    retry_in: float | None = None  # a parked run is due in this many seconds: signal it then
    busy: bool = False  # another worker holds the group (it will see the new work)
    quota: QuotaWait | None = None  # the group is over a quota until then (retry_in says how long)
    # The fleet is at ORCHESTRATOR_MAX_CONCURRENT_RUNS: the group waits in line (retry_in: the re-check).
    waiting: SlotWait | None = None
    # Runs a dead lease holder left, closed by this step before it ran (sweeper.recover_group).
    recovered: list[str] = field(default_factory=list)

    @property
    def freed_slot(self) -> bool:
        """This step ended a run (not parked, nor left to a new lease holder), or closed a
        dead holder's: a slot is free, so the groups next in line are signalled now
        (``store.slots.to_wake``), not at their next re-check."""
        ended = self.outcome is not None and self.outcome.retry_in is None and self.outcome.run.finished_at is not None
        return bool(self.recovered) or ended


@dataclass
class RunOutcome:
    run: Run
    stored: list[int] = field(default_factory=list)  # seqs of stored outputs
    replied: bool = False  # an assistant reply reached the chat
    # The run's output caps, shared by its attempts (orchestrator/sandbox/bounded_io.py).
    budget: OutputBudget | None = None
    # Set when this attempt parked the run: its next attempt is due in this many seconds.
    retry_in: float | None = None
    # Outputs are numbered across the run's attempts (their ids, run_id-NNNN,
    # must never repeat): the last number given.
    indexed: int = 0
    # When the oldest message the run answers was stored (the database's clock; metrics).
    waiting_since: datetime | None = None
    # The model the run's input names (its result_meta record says which answered).
    model: ModelSettings | None = None
    # The run's end let go of the group's lease: the pending mark and cursor it left
    # (None: it did not, or the run has not ended).
    released: tuple[int, int] | None = None


class StoredOutput(NamedTuple):
    """An output stored in a run's transaction, for what follows its commit."""

    message: StoredMessage
    created: bool  # False: its id was stored already (the first copy stands)
    queued: int  # deliveries queued for the group's channels
    first_reply_at: datetime | None  # the run's first reply: when (the database's clock)


class Pipeline:
    def __init__(
        self,
        settings: Settings,
        db: Database,
        channels: ChannelRegistry,
        sandbox: Sandbox | None = None,
        *,
        signal_delivery: Callable[[str], object] | None = None,
        clock: Clock = SYSTEM_CLOCK,
        deadline_exceptions: tuple[type[BaseException], ...] = (),
    ) -> None:
        self.settings = settings
        self.db = db
        self.channels = channels
        # Outputs are queued for the group's channels with the message; a
        # worker signals the delivery queue, anything else (tests) sends them
        # right here on ``channels`` (orchestrator/run/outbound.py).
        self.signal_delivery = signal_delivery
        self._sandbox = sandbox
        self.clock = clock
        # host_id:pid:nonce: the lease and run owner, attributed to its host by `orchestrator hosts`.
        self.owner = process_owner(settings.effective_host_id)
        # Exceptions that mean "out of time" (Celery's soft time limit); set by the worker.
        self.deadline_exceptions = deadline_exceptions

    @property
    def sandbox(self) -> Sandbox:
        """Where runs go: the one given (the composition root's, or a test's
        fake), else warm or cold containers as the settings say."""
        if self._sandbox is None:
            cold = DockerSandbox(self.settings)
            self._sandbox = WarmPool(self.settings, cold.client) if self.warm else cold
        return self._sandbox

    @property
    def warm(self) -> bool:
        """Runs go to a warm per-group container (``orchestrator/sandbox/warm.py``)."""
        return self.settings.warm_idle_s > 0

    # -- the loop -----------------------------------------------------------

    def step(self, chat_jid: str, *, task_id: str | None = None) -> Step:
        """At most one attempt at one run of ``chat_jid``: what one Celery task does.

        Under the group's lease: a parked run (a failed attempt waiting for
        its retry) comes first, and only once it is due; otherwise the next
        batch of pending messages gets a run.  The caller signals the group
        again for what is left (``Step.more``) or when the parked run is due
        (``Step.retry_in``): a task never holds a worker slot through a
        backoff, nor through a second run that Celery's time limit, sized for
        one run, could cut.
        """
        ttl = self.settings.lease_ttl_s
        # Taking the lease reads the group and places one without a live place on this host
        # (store/placement.py), in one statement.
        group = leases.take(self.db, chat_jid, self.owner, ttl, place=self.settings.effective_host_id)
        if group is None:
            log.info("group %s is busy elsewhere; its lease holder will see the new work", chat_jid)
            return Step(busy=True)
        step: Step | None = None
        try:
            # The group's unfinished runs, read once: a dead holder's are closed first (the slot
            # it held is free, the cursor may move), a parked one waits for its retry.
            unfinished = unfinished_runs(self.db, chat_jid)
            recovered = recover_group(self.db, chat_jid, self.owner, sandbox=self.sandbox, unfinished=unfinished)
            if recovered:
                group = get_group(self.db, chat_jid)
            with (
                leases.Heartbeat(self.db, chat_jid, self.owner, ttl, clock=self.clock) as heartbeat,
                log_context(chat_jid=chat_jid),
            ):
                step = self._step_held(group, parked_of(unfinished), task_id, heartbeat.lost)
        finally:
            # A run's end let go of the lease in its own transaction; else it is let go of here.
            ended = step.outcome.released if step is not None and step.outcome is not None else None
            released = ended if ended is not None else leases.release(self.db, chat_jid, self.owner)
        step.recovered = recovered
        if step.retry_in is None and step.quota is None:  # a run ended, or there was nothing to run
            # Looked at in the release's own statement, so a message whose signal bounced
            # off our lease is not left waiting for the sweeper.
            pending, cursor = released if released is not None else leases.marks(self.db, chat_jid)
            step.more = pending > cursor
        return step

    def _step_held(
        self,
        group: Group,
        parked: Run | None,
        task_id: str | None,
        lease_lost: threading.Event,
    ) -> Step:
        """The step's work under the group's lease (see :meth:`step`); ``group`` as the lease's
        statement read it, ``parked`` the group's run waiting for its retry."""
        chat_jid = group.chat_jid
        if parked is not None:
            due_in = self._due_in(parked)
            if due_in > 0:
                return Step(retry_in=due_in)
            with log_context(run_id=parked.id), run_span(self.db, parked):
                outcome = self.resume(parked, task_id=task_id, lease_lost=lease_lost)
            return Step(outcome=outcome, retry_in=outcome.retry_in)
        if group.pending_seq <= group.cursor_seq:
            return Step(outcome=None)
        # A group over its runs-per-hour or tokens-per-day quota starts nothing:
        # its messages wait, and people are told when the next run starts (once per wait).
        wait = quota_wait(self.db, self.settings, group)
        if wait is not None:
            # Waiting for its quota, not for a run slot: it must not hold others back.
            leave_line(self.db, self.settings.max_concurrent_runs, chat_jid)
            metrics.QUOTA_WAITS.labels(wait.quota).inc()
            if store_quota_notice(self.db, chat_jid, wait) is not None:
                # The wait's first sighting: the group comes back when it ends (a countdown).
                self._deliver(chat_jid)
                return Step(retry_in=max(1.0, wait.wait_s), quota=wait)
            # The same wait again (a sweep's re-signal, a duplicate task): its countdown is on
            # its way, and another now would be one more for each sweep of a wait hours long.
            # Were it lost, the sweep after the wait's end starts the run.
            return Step(quota=wait)
        try:
            started = self.run_once(group, task_id=task_id, lease_lost=lease_lost)
        except FleetFull as full:
            # ORCHESTRATOR_MAX_CONCURRENT_RUNS runs are unfinished (or better-ranked
            # groups wait for the free slots): nothing started, the group waits in
            # line (store/slots.py); the run that frees a slot signals the next.
            return Step(retry_in=full.retry_in, waiting=full.wait)
        return Step(outcome=started, retry_in=None if started is None else started.retry_in)

    def drain_group(self, chat_jid: str, *, task_id: str | None = None) -> list[RunOutcome]:
        """Step until nothing is pending, waiting out retries on the clock: for
        callers without a task queue to come back later (tests, benchmarks).
        The finished runs' outcomes, in order."""
        outcomes: list[RunOutcome] = []
        while True:
            step = self.step(chat_jid, task_id=task_id)
            if step.outcome is not None and step.outcome.retry_in is None:
                outcomes.append(step.outcome)
            if step.quota is not None:
                return outcomes  # hours away, on the database's clock: a signal comes back for it
            if step.retry_in is not None:
                self.clock.wait(threading.Event(), step.retry_in)
            elif step.busy or not step.more:
                return outcomes

    def follow_up(self, chat_jid: str, step: Step, signal: Callable[[str, float | None], object]) -> None:
        """Signal what ``step`` left for later steps: the group again (at once
        for more pending work, with a countdown for a parked run or a wait),
        and, when it freed a run slot under ORCHESTRATOR_MAX_CONCURRENT_RUNS,
        the groups first in line now rather than at their next re-check.  A
        signal that cannot be sent is left to the sweeper."""
        wanted: list[tuple[str, float | None]] = []
        if step.retry_in is not None:
            wanted.append((chat_jid, step.retry_in))
        elif step.more:
            wanted.append((chat_jid, None))
        if step.freed_slot:
            wanted += [(waiting, None) for waiting in to_wake(self.db, self.settings.max_concurrent_runs)]
        for jid, countdown in wanted:
            try:
                signal(jid, countdown)
            except Exception as exc:  # noqa: BLE001 - the sweeper signals pending and due groups
                log.warning("could not signal %s again (%s); the sweeper will", jid, exc)

    def _due_in(self, run: Run) -> float:
        assert run.retry_at is not None
        return max(0.0, (run.retry_at - self.clock.now()).total_seconds())

    # -- one run --------------------------------------------------------------

    def run_once(
        self, group: Group, *, task_id: str | None = None, lease_lost: threading.Event | None = None
    ) -> RunOutcome | None:
        """A new run over the pending batch: its first attempt (parked if it should be retried)."""
        planned = plan_batch(get_messages_after(group.chat_jid, group.cursor_seq, db=self.db))
        if not isinstance(planned, Batch):
            # Nothing to answer: the pending mark points at nothing left to
            # read, or only our own output precedes an isolated task.
            self._advance(group, group.pending_seq if planned is None else planned, None)
            return None
        batch = planned
        prior = prior_messages(self.db, self.settings, group, batch, group.cursor_seq)
        # The run row is the run's slot under ORCHESTRATOR_MAX_CONCURRENT_RUNS: none free, FleetFull.
        run = take_slot(
            self.db,
            self.settings.max_concurrent_runs,
            chat_jid=group.chat_jid,
            cursor_from=group.cursor_seq,
            cursor_to=batch.cursor_to,
            celery_task_id=task_id,
            owner=self.owner,
        )
        since = waiting_since(self.db, group.chat_jid, group.cursor_seq, batch.cursor_to)
        metrics.run_created(run.created_at, since)
        with log_context(run_id=run.id), run_span(self.db, run):
            return self._first_attempt(group, run, batch, prior, lease_lost, since)

    def _first_attempt(
        self,
        group: Group,
        run: Run,
        batch: Batch,
        prior: list[StoredMessage],
        lease_lost: threading.Event | None,
        waiting_since: datetime | None = None,
    ) -> RunOutcome:
        """A new run's input, built and recorded once, and its first attempt."""
        assistant = group.assistant_name or self.settings.assistant_name
        outcome = RunOutcome(run=run, waiting_since=waiting_since)
        try:
            # The input is the same for every attempt: build and record it once.
            payload = build_input(
                settings=self.settings,
                group=group,
                run_id=run.id,
                prior=prior,
                batch=batch,
                assistant_name=assistant,
                notices=compute_notices(self.db, self.settings, group),
                model=model_settings(self.settings),
                send_targets=send_targets(self.db, group),
            )
            record_input(self.db, run.id, input_bytes(payload))
        except ConfigError as exc:
            result = Attempt("failed", str(exc))
        except Exception as exc:  # noqa: BLE001 - the run still ends cleanly, with a host message
            log.exception("could not assemble the input of run %s", run.id)
            result = Attempt("failed", f"{type(exc).__name__}: {exc}")
        else:
            result = self._attempt(group, run, payload, assistant, outcome, lease_lost, RunSpend())
        return self._conclude(group, outcome, result, batch.isolated)

    def resume(self, run: Run, *, task_id: str | None = None, lease_lost: threading.Event | None = None) -> RunOutcome:
        """A parked run's next attempt (or its end, if it was cancelled while it waited)."""
        group = get_group(self.db, run.chat_jid)
        outcome = self._earlier_attempts(run)
        # The same batch as the first attempt: the messages up to its cursor.
        batch = plan_batch(
            [m for m in get_messages_after(run.chat_jid, run.cursor_from, db=self.db) if m.seq <= run.cursor_to]
        )
        isolated = isinstance(batch, Batch) and batch.isolated
        spent = RunSpend(Usage(input_tokens=run.input_tokens, output_tokens=run.output_tokens))
        raw = stored_input(self.db, run.id)
        if run.state == "cancelled":
            result = Attempt("cancelled", "cancelled by request", spent.usage)
        elif raw is None:
            result = Attempt("failed", "the run's recorded input is missing", spent.usage)
        else:
            resume_run(self.db, run.id, owner=self.owner, celery_task_id=task_id)
            assistant = group.assistant_name or self.settings.assistant_name
            result = self._attempt(group, run, decode_input(raw), assistant, outcome, lease_lost, spent)
        return self._conclude(group, outcome, result, isolated)

    def _earlier_attempts(self, run: Run) -> RunOutcome:
        """A parked run's outcome as its earlier attempts left it: the outputs
        they stored (in any chat), numbered on from the last, and the output
        caps charged with them, since the caps are the run's and a retry does
        not start from zero (each stored output counts one line; lines that
        stored nothing were not kept)."""
        outcome = RunOutcome(
            run=run, budget=OutputBudget(self.settings.max_run_events, self.settings.max_run_stored_bytes)
        )
        assert outcome.budget is not None
        for stored in run_messages(self.db, run.id):
            outcome.stored.append(stored.seq)
            outcome.budget.lines += 1
            outcome.budget.stored_bytes += len(stored.content.encode("utf-8")) + (
                len(msgspec.json.encode(stored.metadata)) if stored.metadata else 0
            )
            number = stored.id[len(run.id) + 1 : len(run.id) + 5]
            if number.isdigit():
                outcome.indexed = max(outcome.indexed, int(number))
        return outcome

    def _conclude(self, group: Group, outcome: RunOutcome, result: Attempt, isolated: bool) -> RunOutcome:
        """Park the run for a retry, or end it: the host message, the cursor, the run row."""
        run = outcome.run
        if result.lease_lost:
            return self._taken_over(outcome, result.error)
        # A run that already answered is never replayed from the start (no
        # duplicate replies). Tool records of a failed attempt stay: those
        # commands did run.
        if result.retryable and not outcome.replied and run.attempts < self.settings.max_attempts:
            delay = backoff_delay(run.attempts, self.settings.retry_base_s, self.settings.retry_max_s)
            log.warning("run %s attempt %d failed (%s); retrying in %.1fs", run.id, run.attempts, result.error, delay)
            outcome.run = park_run(
                self.db,
                run.id,
                attempts=run.attempts + 1,
                error=result.error,
                retry_at=self.clock.now() + timedelta(seconds=delay),
                input_tokens=result.usage.input_tokens,
                output_tokens=result.usage.output_tokens,
            )
            outcome.retry_in = delay
            tracing.annotate(run_state="parked", error=result.error, retry_in_s=round(delay, 3))
            return outcome
        try:
            notice = self._stop_notice(group, outcome, result)
            if result.state == "cancelled":
                self._emit(group, host_message(run_id=run.id, text="🛑 Run cancelled."), outcome)
            elif notice is not None:
                # A limit stopped it: say which, and how to raise it.
                self._emit(group, host_message(run_id=run.id, text=notice), outcome)
            elif result.state != "succeeded":
                self._emit(group, host_message(run_id=run.id, text=f"⚠️ Agent error: {result.error}"), outcome)
            record = self._result_meta(outcome, result)
        except LeaseLost as lost:
            return self._taken_over(outcome, str(lost))
        session_id = None if isolated else result.session_id
        try:
            with self._output_span(record, outcome):
                # The run's end is one transaction: the run row's end; its record (stored only,
                # for people and tools, never the model); the cursor past its batch and the
                # lease let go of, in one statement that also proves the lease still ours (the
                # fence: else LeaseLost, and nothing of the end is committed).  The pending mark
                # and cursor the release leaves say whether work is left (Pipeline.step).  In
                # this order: the record's insert takes the message-seq lock and ingest takes
                # it before the group's row, so the row comes after it here too (no deadlock),
                # and the run row before it (no one else locks a run row after the seq lock).
                with self.db.transaction() as conn:
                    ended = finish_run(
                        self.db,
                        run.id,
                        state=result.state,
                        error=result.error,
                        input_tokens=result.usage.input_tokens,
                        output_tokens=result.usage.output_tokens,
                        conn=conn,
                    )
                    stored = self._insert_output(conn, group, record, outcome, fenced=True)
                    released = leases.end_hold(conn, group.chat_jid, self.owner, run.cursor_to, session_id)
                # Committed: the run has ended and the lease is let go of (a LeaseLost above
                # rolled all of it back, and the outcome still says the run is unfinished).
                outcome.run, outcome.released = ended, released
                self._stored(group, outcome, stored)
        except LeaseLost as lost:
            return self._taken_over(outcome, str(lost))
        metrics.run_finished(outcome.run.state, outcome.run.duration_s)
        tracing.annotate(run_state=outcome.run.state, error=outcome.run.error, outputs=len(outcome.stored))
        if outcome.run.state != "succeeded":
            tracing.failed(outcome.run.error or outcome.run.state)
        log.info(
            "run %s of %s ended %s after %d attempt(s), %d output(s) stored",
            run.id,
            group.chat_jid,
            outcome.run.state,
            outcome.run.attempts,
            len(outcome.stored),
        )
        return outcome

    def _stop_notice(self, group: Group, outcome: RunOutcome, result: Attempt) -> str | None:
        """The chat's message when a limit stopped the run (orchestrator/run/stop_notice.py), else None."""
        if result.limit is None:
            return None
        max_tokens = outcome.model.max_tokens if outcome.model is not None else self.settings.max_tokens
        return stop_notice(
            result.limit,
            settings=self.settings,
            group=group,
            num_turns=result.num_turns,
            max_tokens=max_tokens,
            tokens_spent=result.usage.input_tokens + result.usage.output_tokens,
        )

    def _result_meta(self, outcome: RunOutcome, result: Attempt) -> OutputMessage:
        """The run's ``result_meta`` record (orchestrator/run/result_meta.py)."""
        run = outcome.run
        provider: str
        if outcome.model is not None:
            provider, model = outcome.model.provider, outcome.model.model
        else:  # the input was never built (a bad ORCHESTRATOR_MODEL among the reasons)
            provider, _, model = self.settings.model.strip().partition(":")
            model = model or provider
        duration = None
        if run.started_at is not None:
            # The clock started_at was taken from, as finish_run's.
            duration = max(0.0, (self.db.now() - run.started_at).total_seconds())
        return result_meta_message(
            run_id=run.id,
            provider=provider,
            model=model,
            state=result.state,
            stop_reason=result.stop_reason,
            limit=result.limit,
            num_turns=result.num_turns,
            attempts=run.attempts,
            duration_s=duration,
            usage=result.usage,
        )

    def _taken_over(self, outcome: RunOutcome, why: str | None) -> RunOutcome:
        """The group's lease went to another worker during this run: stop here, store
        nothing more, leave the run as it is.  Its new holder closes it before it runs
        (``sweeper.recover_group``: a reply already stored moves the cursor on, none
        leaves the messages pending for the new run), or the sweeper does."""
        metrics.LEASE_LOSSES.inc()
        log.warning("run %s of %s: %s; left to the group's new lease holder", outcome.run.id, outcome.run.chat_jid, why)
        return outcome

    def _attempt(
        self,
        group: Group,
        run: Run,
        payload: ContainerInput,
        assistant: str,
        outcome: RunOutcome,
        lease_lost: threading.Event | None,
        spend: RunSpend,
    ) -> Attempt:
        """One attempt at the run in its container; ``spend`` carries the earlier attempts' tokens
        (the budget is the run's: a retry must not start from zero)."""
        outcome.model = payload.model
        try:
            return self._execute(group, run, payload, assistant, outcome, lease_lost, spend)
        except self.deadline_exceptions:
            # The task queue's own time limit: the container is already
            # stopped (the sandbox context exits on the way out); no retry.
            return Attempt(
                "timed_out", "the worker's time limit for this task was reached", spend.usage, limit="task_time_limit"
            )
        except (ConfigError, MountRefused) as exc:
            # A bad container_config or a mount the allowlist refuses now: no retry helps.
            return Attempt("failed", str(exc), spend.usage)
        except Exception as exc:  # noqa: BLE001 - every failure ends the attempt cleanly
            log.exception("run %s for %s failed", run.id, group.chat_jid)
            return Attempt("failed", f"{type(exc).__name__}: {exc}", spend.usage, retryable=True)

    def _execute(
        self,
        group: Group,
        run: Run,
        payload: ContainerInput,
        assistant: str,
        outcome: RunOutcome,
        lease_lost: threading.Event | None,
        spend: RunSpend,
    ) -> Attempt:
        # Its volumes are mounted on one machine at a time (a fleet shares the data dir).
        hold_for_attempt(self.db, self.settings, group, payload.model.provider)
        # The group's limits and mounts, checked against the allowlist as it is now.
        plan = container_plan(self.settings, group)
        spec = ContainerSpec(
            image=image_name(self.settings, model_variant(payload.model.provider)),
            name=f"orch-{group.folder}-{run.id[:8]}-{uuid.uuid4().hex[:4]}",
            workspace=plan.workspace,
            run_id=run.id,
            group_folder=group.folder,
            memory=plan.limits.memory,
            cpus=plan.limits.cpus,
            pids=plan.limits.pids,
            timeout_s=plan.limits.run_timeout_s,
            fence_s=self.settings.sandbox_fence_s,
            install_id=self.settings.install_id,
            # A provider that keeps its own transcript gets the group's session folder.
            extra_mounts={
                **plan.read_write_mounts,
                **session_mount(self.settings, group.folder, payload.model.provider),
            },
            readonly_mounts=plan.read_only_mounts,
        )
        with contextlib.ExitStack() as cleanup:
            gateway: ModelGateway | None = None
            # Runs last, after the gateway closed (it waits for a request in
            # flight): the final count, kept when the attempt raised.
            cleanup.push(lambda *_: spend.record(gateway))
            if payload.model.provider != "offline":
                # The container has no network: its only way to the model is
                # the gateway socket, bound in a host-only folder that is
                # mounted read-only (the run's own folder; for a warm
                # container, the group's gateway folder, mounted for good),
                # so the container can connect but never plant a symlink
                # where the host binds, chmods or cleans up.
                if self.warm:
                    gw_dir = host_only_dir(gateway_dir(self.settings, group.folder))
                else:
                    gw_dir = host_only_dir(self.settings.runs_dir / run.id)
                    cleanup.callback(shutil.rmtree, gw_dir, ignore_errors=True)
                    spec = replace(spec, readonly_mounts={**spec.readonly_mounts, str(gw_dir): GATEWAY_MOUNT})
                # The run may ask for the model and output cap its recorded input names, no other.
                gateway = cleanup.enter_context(
                    ModelGateway.for_provider(
                        gw_dir / GATEWAY_SOCKET,
                        self.settings,
                        payload.model.provider,
                        spent=spend.usage,
                        model=payload.model.model,
                        max_tokens=payload.model.max_tokens,
                    )
                )
                socket_path = f"{GATEWAY_MOUNT}/{GATEWAY_SOCKET}"
                payload = payload.replace(model=payload.model.replace(socket_path=socket_path))
            if spec.fence_s:  # the runner stops everything once this worker is gone (agent_runner/fence.py)
                payload = payload.replace(host_fence_s=spec.fence_s)
            # The container's span: what it writes is stored under it; the runner gets its context.
            with tracing.span(
                "agent container", attributes={"orchestrator.run_id": run.id, "orchestrator.warm": self.warm}
            ):
                if tracing.enabled():
                    payload = payload.replace(traceparent=tracing.traceparent())
                return self._stream(group, run, payload, assistant, outcome, spec, gateway, lease_lost)

    def _stream(
        self,
        group: Group,
        run: Run,
        payload: ContainerInput,
        assistant: str,
        outcome: RunOutcome,
        spec: ContainerSpec,
        gateway: ModelGateway | None,
        lease_lost: threading.Event | None,
    ) -> Attempt:
        result: ResultEvent | None = None
        error: ErrorEvent | None = None
        limit: OutputLimitExceeded | None = None
        fenced: LeaseLost | None = None
        garbage = 0
        settings = self.settings
        # Everything the container writes is hostile: its lines, their number
        # and what they would store are bounded (orchestrator/sandbox/bounded_io.py).
        if outcome.budget is None:
            outcome.budget = OutputBudget(settings.max_run_events, settings.max_run_stored_bytes)
        budget = outcome.budget
        # The reply as it is written, for the chat's live view; never stored (live_draft.py).
        draft = LiveDraft(
            self.db,
            run.id,
            group.chat_jid,
            max_bytes=settings.max_event_line_bytes,
            free_lines=FREE_LINES_PER_EVENT * settings.max_run_events,
            free_bytes=settings.max_run_stored_bytes,
            max_written=settings.max_run_stored_bytes,
        )
        asked = time.perf_counter()
        with self.sandbox.start(spec, input_bytes(payload)) as container, contextlib.closing(draft):
            metrics.container_started(asked, container)
            set_container(self.db, run.id, container.id)
            tracing.annotate(container_id=container.id, cold=getattr(container, "cold", True))
            with StopWatch(self.db, run.id, container.kill, lease_lost, clock=self.clock) as stop:
                try:
                    for line in container.lines(settings.max_event_line_bytes):
                        if not line.strip():
                            budget.line()
                            continue
                        try:
                            event = parse_event(line)
                        except ProtocolError:
                            budget.line()
                            garbage += 1
                            if garbage <= 5:  # a flood of garbage must not flood the worker's log
                                log.warning("run %s: ignoring a line that is not an event: %.200r", run.id, line)
                            continue
                        if isinstance(event, TextDeltaEvent):
                            # Shown, not stored: bounded by the draft's own allowance, past
                            # which each delta line counts like any other line.
                            if not draft.add(event):
                                budget.line()
                            continue
                        budget.line()
                        if isinstance(event, ResultEvent):
                            result = event
                        elif isinstance(event, ErrorEvent):
                            error = event
                        elif isinstance(event, SendMessageEvent):
                            budget.store(len(event.text.encode("utf-8")))
                            outcome.indexed += 1
                            self._send_message(group, event, run.id, outcome.indexed, assistant, outcome)
                        else:
                            outcome.indexed += 1
                            out = event_to_message(
                                event,
                                run_id=run.id,
                                index=outcome.indexed,
                                assistant_name=assistant,
                                max_tool_result_bytes=settings.max_tool_result_bytes,
                            )
                            if out is not None:
                                budget.store(stored_size(out))
                                self._emit(group, out, outcome)
                                if isinstance(event, AssistantEvent):
                                    draft.stored()  # the stored reply takes the draft's place
                except OutputLimitExceeded as exc:
                    # Stop reading and stop the agent: whatever it writes next is not read.
                    limit = exc
                    log.warning("run %s: %s", run.id, exc)
                    container.kill()
                except LeaseLost as exc:
                    # Taken over (a pause or partition made this host look dead): the
                    # output was not stored, and the agent must not go on beside the new run.
                    fenced = exc
                    container.kill()
                exit_ = container.finish()
        tracing.annotate(exit_code=exit_.status_code, timed_out=exit_.timed_out, unreadable_lines=garbage)
        if garbage > 5:
            log.warning("run %s: %d lines that are not events in all", run.id, garbage)
        usage = result.usage if result else Usage()
        if gateway is not None:
            # Count what the gateway saw, not what the sandbox claims.
            usage = gateway.usage
        if stop.reason == "cancelled":
            return Attempt("cancelled", "cancelled by request", usage)
        if fenced is not None or stop.reason == "lease_lost":
            why = str(fenced) if fenced is not None else "this worker lost the group's lease"
            return Attempt("failed", f"{why}; the run was stopped", usage, lease_lost=True)
        if limit is not None:
            # The agent would break it again: no retry.
            return Attempt("failed", str(limit), usage, retryable=False)
        if exit_.timed_out:
            return Attempt("timed_out", f"the run exceeded its {spec.timeout_s:.0f}s limit", usage, limit="timeout")
        spent_budget: Limit | None = "token_budget" if gateway is not None and gateway.budget_refusals else None
        if error is not None:
            # The container's words become a host message: keep them short.
            return Attempt("failed", error.message[:2000], usage, retryable=error.retryable, limit=spent_budget)
        if exit_.status_code != 0 or result is None:
            tail = exit_.stderr_tail.strip().splitlines()[-1:] or [""]
            why = f"the agent container exited with status {exit_.status_code}"
            if exit_.status_code == 137:
                why += " (killed: out of memory or stopped)"
            if garbage:
                why += f" after {garbage} unreadable output line(s)"
            if tail[0]:
                why += f": {tail[0][:300]}"
            # A crash is worth another try; the attempt loop decides if it may.
            return Attempt("failed", why, usage, retryable=True)
        return Attempt(
            "succeeded",
            None,
            usage,
            session_id=result.session_id,
            stop_reason=result.stop_reason,
            num_turns=result.num_turns,
            limit=STOP_REASON_LIMITS.get(result.stop_reason or ""),
        )

    # -- storage --------------------------------------------------------------

    def _emit(self, group: Group, out: OutputMessage, outcome: RunOutcome) -> None:
        """Store ``out`` in a transaction of its own (fixed statements on the driver)."""
        with self._output_span(out, outcome):
            with self.db.transaction() as conn:
                stored = self._insert_output(conn, group, out, outcome)
            self._stored(group, outcome, stored)

    @contextlib.contextmanager
    def _output_span(self, out: OutputMessage, outcome: RunOutcome) -> Iterator[None]:
        # Each stored output is a span of the run's trace (orchestrator/core/tracing.py).
        with tracing.span(
            f"store {out.message_type}",
            attributes={"orchestrator.message_id": out.id, "orchestrator.sender": out.sender},
        ):
            before = len(outcome.stored)
            yield
            tracing.annotate(seq=outcome.stored[-1] if len(outcome.stored) > before else None)

    def _insert_output(
        self,
        conn: Connection,
        group: Group,
        out: OutputMessage,
        outcome: RunOutcome,
        *,
        fenced: bool = False,
    ) -> StoredOutput:
        """Store ``out`` in the caller's transaction, if this worker still holds the group's lease
        (else :class:`LeaseLost`, and the caller's transaction stores nothing; ``fenced``: the
        caller's transaction made sure of it already).

        What can be read before the message is inserted is (the lease, the group's channels,
        the clock): the insert takes the lock that orders every message's seq and holds it to
        the commit, so every statement after it holds back every other writer of messages
        (``bench/db_reach.py``: the lock is where one database saturates)."""
        # Outputs remember the last input their run saw: messages that arrive
        # during a run get later seqs than the run's replies, but the model
        # must see those replies first (see views.model_order).
        fields = out.model_dump()
        fields["metadata"] = {
            **(fields["metadata"] or {}),
            REPLY_TO_KEY: outcome.run.cursor_to,
            RUN_ID_KEY: outcome.run.id,
        }
        if not fenced:
            leases.fence(conn, group.chat_jid, self.owner)  # nothing stored by a replaced holder
        attached = attached_channels(conn, group.chat_jid) if out.sender not in STORED_ONLY_SENDERS else []
        # The run's first reply: when, on the clock its creation was taken from (metrics).
        first_reply = out.sender == SENDER_BOT and not outcome.replied
        now = db_now(conn) if first_reply else None
        new = NewMessage(chat_jid=group.chat_jid, timestamp=now_iso(), is_from_me=True, **fields)
        msg, created = insert_message(conn, self.db, new)
        queued = record_deliveries(conn, msg, attached) if created else 0
        return StoredOutput(msg, created, queued, now if created else None)

    def _stored(self, group: Group, outcome: RunOutcome, stored: StoredOutput) -> None:
        """What follows an output's commit: the run's record of it, metrics, the delivery signal."""
        if stored.first_reply_at is not None:
            metrics.first_reply(outcome.run.created_at, stored.first_reply_at, outcome.waiting_since)
        if stored.created:
            outcome.stored.append(stored.message.seq)
            if stored.message.sender == SENDER_BOT:
                outcome.replied = True
        if stored.queued:
            self._deliver(group.chat_jid)

    def _send_message(
        self, group: Group, event: SendMessageEvent, run_id: str, index: int, assistant: str, outcome: RunOutcome
    ) -> None:
        """Post the agent's message where it asked, if this group may post there."""
        refusal = send_refusal(self.db, group, event.chat_jid)
        if refusal is not None:
            log.warning("run %s: send_message refused: %s", run_id, refusal)
            self._emit(
                group, host_message(run_id=f"{run_id}-{index:04d}", text=f"🚫 send_message refused: {refusal}"), outcome
            )
            return
        out = event_to_message(AssistantEvent(text=event.text), run_id=run_id, index=index, assistant_name=assistant)
        if out is None:
            return
        if event.chat_jid == group.chat_jid:
            self._emit(group, out, outcome)
            return
        # Another chat (main group only): stored there as our message; it
        # does not wake that chat's agent and is not this run's reply.
        meta = {**(out.metadata or {}), "via": "send_message", "from_chat": group.chat_jid, RUN_ID_KEY: run_id}
        with self.db.write() as session:
            leases.fence(session, group.chat_jid, self.owner)
            fields = {**out.model_dump(), "metadata": meta}
            new = NewMessage(chat_jid=event.chat_jid, timestamp=now_iso(), is_from_me=True, **fields)
            msg, created = insert_message(session, self.db, new)
            queued = record_deliveries(session, msg) if created else 0
        if queued:
            self._deliver(event.chat_jid)

    def _deliver(self, chat_jid: str) -> None:
        """Off the run's path: signal a deliverer, or (no queue) send here; never raises."""
        try:
            if self.signal_delivery is not None:
                self.signal_delivery(chat_jid)
            else:
                Deliverer(self.db, self.settings, self.channels).deliver_due(chat_jid)
        except Exception as exc:  # noqa: BLE001 - stored and queued; the sweeper re-signals
            log.warning("delivery for %s not started now (%s); the sweeper will", chat_jid, exc)

    def _advance(self, group: Group, cursor_to: int, session_id: str | None) -> None:
        with self.db.transaction() as conn:
            leases.move_cursor(conn, group.chat_jid, cursor_to, session_id)
