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

The attempt itself, in its container, is ``run/attempt.py``'s (shared with
replays); here it gets what a chat run adds: its outputs stored and delivered
as they arrive (``run/chat_outputs.py``), its live draft, the group's
workspace under this host's volume hold, the lease's stop signal.  What
follows an attempt (parked, or ended in one transaction) is
``run/conclusion.py``'s.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime

import msgspec

from agent_runner.protocol import ContainerInput, Usage, decode_input
from orchestrator.core import metrics
from orchestrator.core.clock import SYSTEM_CLOCK, Clock
from orchestrator.core.errors import ConfigError, FleetFull
from orchestrator.core.logs import log_context
from orchestrator.core.settings import Settings
from orchestrator.model.messages import StoredMessage
from orchestrator.run.agent_tasks import run_tasks, task_info
from orchestrator.run.assembly import (
    Batch,
    build_input,
    input_bytes,
    plan_batch,
    prior_messages,
    recorded,
    stored_input,
)
from orchestrator.run.attempt import AttemptContext, Mounts, Verdict, run_attempt
from orchestrator.run.chat_outputs import ChatOutputs
from orchestrator.run.conclusion import conclude
from orchestrator.run.history_cache import HistoryCache
from orchestrator.run.live_draft import FREE_LINES_PER_EVENT, LiveDraft
from orchestrator.run.model_choice import model_settings
from orchestrator.run.notices import compute_notices
from orchestrator.run.outbound import ChannelRegistry, Deliverer
from orchestrator.run.outcome import RunOutcome
from orchestrator.run.run_files import batch_files
from orchestrator.run.run_trace import run_span
from orchestrator.run.sweeper import recover_group
from orchestrator.run.volume_wait import wait_for_volumes
from orchestrator.sandbox.bounded_io import OutputBudget
from orchestrator.sandbox.config import container_plan
from orchestrator.sandbox.containers import DockerSandbox
from orchestrator.sandbox.fencing import hold_for_attempt
from orchestrator.sandbox.port import Sandbox
from orchestrator.sandbox.sessions import session_mount
from orchestrator.sandbox.warm import WarmPool
from orchestrator.store import leases
from orchestrator.store.db import Database
from orchestrator.store.files import FileStore
from orchestrator.store.groups import Group, get_group, send_targets
from orchestrator.store.hosts import process_owner
from orchestrator.store.message_log import get_messages_after, waiting_since
from orchestrator.store.replays import run_messages
from orchestrator.store.runs import Run, new_run_id, parked_of, resume_run, unfinished_runs
from orchestrator.store.slots import SlotWait, leave_line, take_slot, to_wake
from orchestrator.store.usage import QuotaWait, quota_wait, store_quota_notice

log = logging.getLogger(__name__)


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
    # Another host may still have the group's volumes mounted: it waits (retry_in: the re-check).
    volume_holder: str | None = None
    # Runs a dead lease holder left, closed by this step before it ran (sweeper.recover_group).
    recovered: list[str] = field(default_factory=list)

    @property
    def freed_slot(self) -> bool:
        """This step ended a run (not parked, nor left to a new lease holder), or closed a
        dead holder's: a slot is free, so the groups next in line are signalled now
        (``store.slots.to_wake``), not at their next re-check."""
        ended = self.outcome is not None and self.outcome.retry_in is None and self.outcome.run.finished_at is not None
        return bool(self.recovered) or ended


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
        self.owner = process_owner(settings.fleet.effective_host_id)
        # Exceptions that mean "out of time" (Celery's soft time limit); set by the worker.
        self.deadline_exceptions = deadline_exceptions
        # Files people send and the agent hands back (store/files.py); nothing read until used.
        self.files = FileStore.from_settings(db, settings)
        # The history each group's last run here read, for its next (run/history_cache.py).
        self.history = HistoryCache(settings.context.history_cache_groups)

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
        """Runs go to a warm per-group container (``orchestrator/sandbox/warm/``)."""
        return self.settings.sandbox.warm_idle_s > 0

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
        ttl = self.settings.fleet.lease_ttl_s
        # Taking the lease reads the group and places one without a live place on this host
        # (store/placement.py), in one statement.
        group = leases.take(self.db, chat_jid, self.owner, ttl, place=self.settings.fleet.effective_host_id)
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
            held = self._volume_wait(group)
            if held is not None:
                return held
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
            leave_line(self.db, self.settings.fleet.max_concurrent_runs, chat_jid)
            metrics.QUOTA_WAITS.labels(wait.quota).inc()
            if store_quota_notice(self.db, chat_jid, wait) is not None:
                # The wait's first sighting: the group comes back when it ends (a countdown).
                self._deliver(chat_jid)
                return Step(retry_in=max(1.0, wait.wait_s), quota=wait)
            # The same wait again (a sweep's re-signal, a duplicate task): its countdown is on
            # its way, and another now would be one more for each sweep of a wait hours long.
            # Were it lost, the sweep after the wait's end starts the run.
            return Step(quota=wait)
        held = self._volume_wait(group)
        if held is not None:
            return held
        try:
            started = self.run_once(group, task_id=task_id, lease_lost=lease_lost)
        except FleetFull as full:
            # ORCHESTRATOR_MAX_CONCURRENT_RUNS runs are unfinished (or better-ranked
            # groups wait for the free slots): nothing started, the group waits in
            # line (store/slots.py); the run that frees a slot signals the next.
            return Step(retry_in=full.retry_in, waiting=full.wait)
        return Step(outcome=started, retry_in=None if started is None else started.retry_in)

    def _volume_wait(self, group: Group) -> Step | None:
        """The step of a group whose volumes another host may still have mounted: it waits,
        holding no slot nor place in the run line (run/volume_wait.py); None: run now."""
        wait = wait_for_volumes(self.db, self.settings, group, self.sandbox)
        if wait is None:
            return None
        leave_line(self.db, self.settings.fleet.max_concurrent_runs, group.chat_jid)
        if wait.told is not None:
            self._deliver(group.chat_jid)
        log.info("group %s waits for host %s to let go of its volumes", group.chat_jid, wait.holder)
        return Step(retry_in=wait.retry_in, volume_holder=wait.holder)

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
            wanted += [(waiting, None) for waiting in to_wake(self.db, self.settings.fleet.max_concurrent_runs)]
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
        prior = prior_messages(self.db, self.settings, group, batch, group.cursor_seq, self.history)
        # The input is built before the run's row and written with it: one write, not two.
        run_id = new_run_id()
        built = self._build_input(group, run_id, batch, prior)
        # The run row is the run's slot under ORCHESTRATOR_MAX_CONCURRENT_RUNS: none free, FleetFull.
        run = take_slot(
            self.db,
            self.settings.fleet.max_concurrent_runs,
            chat_jid=group.chat_jid,
            cursor_from=group.cursor_seq,
            cursor_to=batch.cursor_to,
            celery_task_id=task_id,
            owner=self.owner,
            run_id=run_id,
            recorded=recorded(input_bytes(built)) if isinstance(built, ContainerInput) else None,
            # The group's warm container as this process knows it: the row says ``running`` on
            # it at once, and the attempt writes the container only if it is given another.
            container_id=self.sandbox.expected_container(group.folder) if isinstance(built, ContainerInput) else None,
        )
        since = waiting_since(self.db, group.chat_jid, group.cursor_seq, batch.cursor_to)
        metrics.run_created(run.created_at, since)
        with log_context(run_id=run.id), run_span(self.db, run):
            return self._first_attempt(group, run, batch, built, lease_lost, since)

    def _build_input(
        self, group: Group, run_id: str, batch: Batch, prior: list[StoredMessage]
    ) -> ContainerInput | Verdict:
        """The input of run ``run_id``, the same for every attempt (built once), or the
        verdict of a run whose input could not be built: it still ends cleanly, with a host
        message."""
        try:
            tasks = run_tasks(self.db, group)
            payload = build_input(
                settings=self.settings,
                group=group,
                run_id=run_id,
                prior=prior,
                batch=batch,
                assistant_name=group.assistant_name or self.settings.assistant_name,
                notices=compute_notices(self.db, self.settings, group, tasks=tasks),
                model=model_settings(self.settings, group),
                send_targets=send_targets(self.db, group),
            )
            if group.tools is not None:
                # The optional tools the group's agent has (unset: all of them).
                payload = payload.replace(tools=group.tools)
            if group.tools is None or "schedules" in group.tools:
                # What the agent's list_tasks answers (orchestrator/run/agent_tasks.py).
                payload = payload.replace(tasks=[task_info(t) for t in tasks])
        except ConfigError as exc:
            return Verdict("failed", str(exc))
        except Exception as exc:  # the run still ends cleanly, with a host message
            log.exception("could not assemble the input of run %s", run_id)
            return Verdict("failed", f"{type(exc).__name__}: {exc}")
        return payload

    def _first_attempt(
        self,
        group: Group,
        run: Run,
        batch: Batch,
        built: ContainerInput | Verdict,
        lease_lost: threading.Event | None,
        waiting_since: datetime | None = None,
    ) -> RunOutcome:
        """A new run's first attempt, on its recorded input (``built``; a verdict: none could be built)."""
        assistant = group.assistant_name or self.settings.assistant_name
        outputs = self._outputs(group, RunOutcome(run=run, waiting_since=waiting_since))
        if isinstance(built, Verdict):
            verdict = built
        else:
            verdict = self._attempt(outputs, built, assistant, lease_lost, Usage(), batch)
        return self._conclude(outputs, verdict, batch.isolated)

    def resume(self, run: Run, *, task_id: str | None = None, lease_lost: threading.Event | None = None) -> RunOutcome:
        """A parked run's next attempt (or its end, if it was cancelled while it waited)."""
        group = get_group(self.db, run.chat_jid)
        outputs = self._outputs(group, self._earlier_attempts(run))
        # The same batch as the first attempt: the messages up to its cursor.
        batch = plan_batch(
            [m for m in get_messages_after(run.chat_jid, run.cursor_from, db=self.db) if m.seq <= run.cursor_to]
        )
        isolated = isinstance(batch, Batch) and batch.isolated
        spent = Usage(input_tokens=run.input_tokens, output_tokens=run.output_tokens)
        raw = stored_input(self.db, run.id)
        if run.state == "cancelled":
            verdict = Verdict("cancelled", "cancelled by request", spent)
        elif raw is None:
            verdict = Verdict("failed", "the run's recorded input is missing", spent)
        else:
            resume_run(self.db, run.id, owner=self.owner, celery_task_id=task_id)
            assistant = group.assistant_name or self.settings.assistant_name
            verdict = self._attempt(
                outputs, decode_input(raw), assistant, lease_lost, spent, batch if isinstance(batch, Batch) else None
            )
        return self._conclude(outputs, verdict, isolated)

    def _earlier_attempts(self, run: Run) -> RunOutcome:
        """A parked run's outcome as its earlier attempts left it: the outputs
        they stored (in any chat), numbered on from the last, and the output
        caps charged with them, since the caps are the run's and a retry does
        not start from zero (each stored output counts one line; lines that
        stored nothing were not kept)."""
        outcome = RunOutcome(
            run=run, budget=OutputBudget(self.settings.runs.max_run_events, self.settings.runs.max_run_stored_bytes)
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

    def _outputs(self, group: Group, outcome: RunOutcome) -> ChatOutputs:
        return ChatOutputs(
            self.db, group, outcome, owner=self.owner, deliver=self._deliver, files=self.files, settings=self.settings
        )

    def _conclude(self, outputs: ChatOutputs, verdict: Verdict, isolated: bool) -> RunOutcome:
        return conclude(outputs, verdict, settings=self.settings, clock=self.clock, isolated=isolated)

    def _attempt(
        self,
        outputs: ChatOutputs,
        payload: ContainerInput,
        assistant: str,
        lease_lost: threading.Event | None,
        spent: Usage,
        batch: Batch | None,
    ) -> Verdict:
        """One attempt at the run in its container (``orchestrator/run/attempt.py``); ``spent``
        carries the earlier attempts' tokens (the budget is the run's: a retry must not start
        from zero).  Its outputs are stored in the chat as they arrive, its streamed text is the
        chat's live draft, and its container gets the group's workspace under this host's
        volume hold."""
        group, outcome, settings = outputs.group, outputs.outcome, self.settings
        run = outcome.run
        outcome.model = payload.model
        if outcome.budget is None:
            outcome.budget = OutputBudget(settings.runs.max_run_events, settings.runs.max_run_stored_bytes)
        # The reply as it is written, for the chat's live view; never stored (live_draft.py).
        draft = LiveDraft(
            self.db,
            run.id,
            group.chat_jid,
            max_bytes=settings.runs.max_event_line_bytes,
            free_lines=FREE_LINES_PER_EVENT * settings.runs.max_run_events,
            free_bytes=settings.runs.max_run_stored_bytes,
            max_written=settings.runs.max_run_stored_bytes,
        )
        ctx = AttemptContext(
            db=self.db,
            settings=settings,
            sandbox=self.sandbox,
            group=group,
            run=run,
            payload=payload,
            assistant=assistant,
            mounts=lambda: self._mounts(group, payload.model.provider),
            outputs=outputs,
            draft=draft,
            budget=outcome.budget,
            warm=self.warm,
            indexed=outcome.indexed,
            spent=spent,
            lease_lost=lease_lost,
            clock=self.clock,
            deadline_exceptions=self.deadline_exceptions,
            files=batch_files(self.files, batch.messages) if batch is not None else [],
            file_store=self.files,
        )
        try:
            return run_attempt(ctx)
        finally:
            outcome.indexed = ctx.indexed  # a retry numbers on from here

    def _mounts(self, group: Group, provider: str) -> Mounts:
        """The group's workspace and mounts for an attempt with ``provider``."""
        # Its volumes are mounted on one machine at a time (a fleet shares the data dir).  The
        # step claimed them for the group's model as it is now (run/volume_wait.py); the attempt
        # runs the recorded input's, which may keep a session volume the other does not: one
        # read while they are held already.
        hold_for_attempt(self.db, self.settings, group, provider)
        # The group's limits and mounts, checked against the allowlist as it is now.
        plan = container_plan(self.settings, group)
        # A provider that keeps its own transcript gets the group's session folder.
        read_write = {**plan.read_write_mounts, **session_mount(self.settings, group.folder, provider)}
        return Mounts(plan.workspace, plan.limits, read_write, plan.read_only_mounts, plan.egress)

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
