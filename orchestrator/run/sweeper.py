"""The sweeper: puts right what a dead worker or a lost signal left behind.

Run by Celery beat every ``sweep_interval_s`` and once when a worker starts.
Everything it does is safe to repeat and safe to run on several hosts:

1. An unfinished (queued or running) run whose group lease has expired (or moved to another
   owner) lost its worker.  If it already stored a reply, it is closed as
   failed and the cursor moves past its input (never replayed: no duplicate
   replies; the group gets a host message).  Otherwise it is closed and its
   messages stay pending, so the next run answers them.
   A parked run (a failed attempt waiting for its retry, no lease held) is
   left alone.
2. Groups with pending work and no live lease are signalled again (a group
   whose parked run is not due yet is not: its retry signal has a countdown).
3. Run containers on this host's Docker engine whose run is not live are
   removed.
4. Deliveries: a claim past its deadline (the deliverer died mid-send) is
   marked failed, never resent; chats with due deliveries are signalled.
5. Retention: runs' egress logs older than ``ORCHESTRATOR_EGRESS_LOG_RETENTION_DAYS``
   are deleted, in bounded batches (the rest at the next sweep).

A lease is dead when it has no holder, has expired by the database's clock
(``now`` is the database's, as the expiries are), or is held by a process of
a host the hosts table gives up for dead (``stopped``, or silent for
``hosts.ALIVE_WINDOW_S``): a dead host's runs are closed and its groups
re-signalled at the next sweep, before their leases expire.

Between sweeps, :func:`recover_group` does step 1 for one group, at once:
the pipeline calls it when it has taken a group's lease, and every worker's
``RecoveryWatch`` (``orchestrator/run/recovery.py``) signals the groups whose
holder is gone, so a SIGKILLed worker's group is taken over within seconds.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Collection
from dataclasses import dataclass, field
from datetime import datetime, timedelta

from orchestrator.core import metrics
from orchestrator.model.messages import NewMessage, StoredMessage
from orchestrator.run.outputs import host_message
from orchestrator.run.questions import expire_due
from orchestrator.sandbox.containers import DockerSandbox
from orchestrator.sandbox.port import Sandbox
from orchestrator.store.db import Database
from orchestrator.store.deliveries import abandon_stale_claims, due_chats, record_deliveries
from orchestrator.store.egress_logs import delete_egress_logs
from orchestrator.store.files import FileStore
from orchestrator.store.groups import advance_cursor
from orchestrator.store.hosts import database_now
from orchestrator.store.leftovers import live_run_ids as live_run_ids
from orchestrator.store.leftovers import lost_replays, stale_runs, unsignalled_groups
from orchestrator.store.message_log import insert_message, now_iso, run_replies
from orchestrator.store.runs import Run, finish_run, unfinished_runs

log = logging.getLogger(__name__)

# Egress log records one sweep deletes at most, a batch per transaction: a backlog (a
# retention just shortened) goes over several sweeps, never in one long delete.
EGRESS_LOG_BATCH = 500
EGRESS_LOG_BATCHES = 10
# Finding them scans the messages table (no index names a record's sender; about 0.2 s for a
# million messages on PostgreSQL): a process looks once this often, not every sweep, unless
# its last look left a backlog (:class:`EgressLogRetention`).
EGRESS_LOG_EVERY_S = 3600.0


@dataclass
class SweepReport:
    interrupted_runs: list[str] = field(default_factory=list)
    signalled_groups: list[str] = field(default_factory=list)
    removed_containers: int = 0
    abandoned_deliveries: int = 0
    delivery_signals: list[str] = field(default_factory=list)
    freed_files: int = 0
    expired_questions: list[str] = field(default_factory=list)
    deleted_egress_logs: int = 0


def sweep(
    db: Database,
    *,
    signal: Callable[[str], object] | None,
    sandbox: DockerSandbox | None = None,
    signal_delivery: Callable[[str], object] | None = None,
    resend_channels: Collection[str] = (),
    files: FileStore | None = None,
    file_grace_s: float = 86400.0,
    egress_log_retention_days: int = 0,
) -> SweepReport:
    report = SweepReport()
    now = database_now(db)  # the database's clock, as the leases' expiries are written
    for run_id, chat_jid, cursor_to in stale_runs(db, now):
        _close_interrupted(db, run_id, chat_jid, cursor_to)
        report.interrupted_runs.append(run_id)
    # A replay (orchestrator/run/replay.py) holds no lease: one whose worker's host died
    # ends failed here, nothing else would end it (its container is then an orphan).
    for run_id in lost_replays(db, now):
        finish_run(db, run_id, state="failed", error="the worker running the replay is gone")
        report.interrupted_runs.append(run_id)

    # Questions nobody answered in time: the agent is told so (nothing wakes), and the chat.
    expired = expire_due(db, now)
    report.expired_questions = [q.id for q in expired]

    pending = unsignalled_groups(db, now)
    if signal is not None:
        for chat_jid in pending:
            signal(chat_jid)
            report.signalled_groups.append(chat_jid)

    if sandbox is not None:
        report.removed_containers = sandbox.remove_orphans(live_run_ids(db))

    # A send cut short: again on the channels whose receivers deduplicate, else given up.
    report.abandoned_deliveries = abandon_stale_claims(db, resend_channels)
    if signal_delivery is not None:
        # The expired questions' notes are due: their chats first.
        for chat_jid in dict.fromkeys([*(q.chat_jid for q in expired), *due_chats(db)]):
            try:
                signal_delivery(chat_jid)
            except Exception as exc:  # noqa: BLE001 - next sweep
                log.warning("could not signal a deliverer for %s (%s)", chat_jid, exc)
                break
            report.delivery_signals.append(chat_jid)
    if files is not None:
        # Files no live message names, past their grace (an upload whose message is to come).
        report.freed_files = len(files.prune(file_grace_s))
    if egress_log_retention_days > 0:
        report.deleted_egress_logs = _delete_old_egress_logs(db, now - timedelta(days=egress_log_retention_days))
    metrics.swept(
        interrupted_runs=len(report.interrupted_runs),
        signalled_groups=len(report.signalled_groups),
        removed_containers=report.removed_containers,
        abandoned_deliveries=report.abandoned_deliveries,
    )
    if (
        report.interrupted_runs
        or report.signalled_groups
        or report.removed_containers
        or report.abandoned_deliveries
        or report.freed_files
        or report.expired_questions
        or report.deleted_egress_logs
    ):
        log.info(
            "sweep: %d interrupted run(s), %d group(s) re-signalled, %d container(s) removed, "
            "%d delivery claim(s) abandoned, %d unreferenced file(s) freed, %d question(s) expired, "
            "%d egress log(s) past their retention deleted",
            len(report.interrupted_runs),
            len(report.signalled_groups),
            report.removed_containers,
            report.abandoned_deliveries,
            report.freed_files,
            len(report.expired_questions),
            report.deleted_egress_logs,
        )
    return report


class EgressLogRetention:
    """When a process's sweep next looks for egress logs past their retention: now and then
    every :data:`EGRESS_LOG_EVERY_S`, or at the next sweep while a backlog is left (a look
    that deleted its whole budget).  ``now`` is a monotonic clock's."""

    def __init__(self, days: int) -> None:
        self.days = days
        self._due = float("-inf")

    def days_now(self, now: float) -> int:
        """The retention to sweep with at ``now``: 0 (not this time, or kept for ever) or the days."""
        return self.days if self.days > 0 and now >= self._due else 0

    def looked(self, now: float, deleted: int) -> None:
        backlog = deleted >= EGRESS_LOG_BATCH * EGRESS_LOG_BATCHES
        self._due = now if backlog else now + EGRESS_LOG_EVERY_S


def _delete_old_egress_logs(db: Database, stored_before: datetime) -> int:
    """The egress log records stored before ``stored_before``, deleted a batch at a time, at
    most :data:`EGRESS_LOG_BATCHES` batches."""
    deleted = 0
    for _ in range(EGRESS_LOG_BATCHES):
        gone = delete_egress_logs(db, stored_before, limit=EGRESS_LOG_BATCH)
        deleted += gone
        if gone < EGRESS_LOG_BATCH:
            break
    return deleted


def _close_interrupted(db: Database, run_id: str, chat_jid: str, cursor_to: int) -> StoredMessage | None:
    outputs = run_replies(db, chat_jid, run_id)
    if outputs:
        # A reply is already in the chat: close the run rather than replay
        # it (no duplicate replies), and tell people it was cut short.
        note = host_message(
            run_id=run_id,
            text="⚠️ Agent error: the run was interrupted (its worker stopped) after it had started answering.",
        )
        with db.write() as session:
            stored, created = insert_message(
                session, db, NewMessage(chat_jid=chat_jid, timestamp=now_iso(), is_from_me=True, **note.model_dump())
            )
            if created:
                record_deliveries(session, stored)  # sent when the sweep signals due deliveries
            advance_cursor(session, chat_jid, cursor_to)
        finish_run(db, run_id, state="failed", error="interrupted after output: its worker stopped")
        metrics.run_finished("failed")
        return stored if created else None
    finish_run(db, run_id, state="failed", error="interrupted before any output: its worker stopped; retried")
    metrics.run_finished("failed")
    return None


def recover_group(
    db: Database,
    chat_jid: str,
    owner: str,
    *,
    sandbox: Sandbox | None = None,
    unfinished: list[Run] | None = None,
) -> list[str]:
    """Close the runs a group's earlier lease holders left unfinished: what the
    pipeline calls right after ``owner`` took the group's lease, before it runs.

    While ``owner`` holds the lease, an unfinished run of the group that is
    not its own (and not parked for a retry) has lost its worker: a holder
    SIGKILLed on this host whose lease ``leases.acquire`` has just taken over,
    a dead host's, or an expired one's that no sweep has reached yet.  Each is
    closed the way the sweeper closes it (step 1 above: a reply already stored
    moves the cursor past its input with a host message; none leaves its
    messages pending for this holder's run), after its containers are removed
    (cold ones, by the run's label; a warm container is replaced by the pool,
    which sees that the run on it never finished), so the next run neither
    answers twice nor loses a message nor shares the workspace with the dead
    run's container.  Safe to repeat and to race with the sweeper.  Returns
    the ids of the runs it closed.

    ``unfinished``: the group's unfinished runs as ``runs.unfinished_runs`` read
    them under this lease (the pipeline reads them once for this and its parked
    run); read here if not given.
    """
    if unfinished is None:
        unfinished = unfinished_runs(db, chat_jid)
    left = [
        (run.id, run.cursor_to, run.owner)
        for run in unfinished
        if run.state in ("queued", "running", "cancelled")
        and run.retry_at is None
        # A replay is no run of the chat's: not this holder's to close.
        and run.replay_of is None
        and run.owner != owner
    ]
    for run_id, cursor_to, gone in left:
        if isinstance(sandbox, DockerSandbox):
            try:
                sandbox.remove_run(run_id)
            except Exception as exc:  # noqa: BLE001 - the sweeper removes it later
                log.warning("could not remove the container(s) of interrupted run %s (%s)", run_id, exc)
        _close_interrupted(db, run_id, chat_jid, cursor_to)
        log.warning(
            "run %s of %s was left unfinished by %s, whose worker is gone; closed before the next run",
            run_id,
            chat_jid,
            gone,
        )
    return [run_id for run_id, _, _ in left]
