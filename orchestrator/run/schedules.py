"""Scheduled tasks: a prompt that wakes a group's agent on a cron line, an
interval, or once.

A task run is an ordinary run: firing stores the prompt as a message in the
group (sender ``scheduler``) and marks the group pending, exactly like an
incoming message, so it takes the same lease and leaves the same records.
The message id is ``sched-<task>-<due epoch>`` and the task's ``next_run_at``
moves on with a conditional UPDATE, so one due time fires once however many
beat processes tick.  A scheduler that was down fires a missed cron or
interval task once (for its latest missed time), not once per missed slot.

Context modes: ``group`` runs with the group's history and session;
``isolated`` runs with the task's prompt alone and no session.

The rows and their statements are ``orchestrator/store/schedules.py``'s.
"""

from __future__ import annotations

import itertools
import logging
import re
import uuid
from collections.abc import Callable
from datetime import UTC, datetime, timedelta

from croniter import CroniterBadDateError, croniter

from orchestrator.core import tracing
from orchestrator.core.errors import Conflict, InvalidMessage
from orchestrator.model.messages import SENDER_SCHEDULER, NewMessage
from orchestrator.store.db import Database
from orchestrator.store.deliveries import record_deliveries
from orchestrator.store.groups import get_group, mark_pending
from orchestrator.store.message_log import insert_message, now_iso
from orchestrator.store.schedules import ContextMode as ContextMode
from orchestrator.store.schedules import ScheduledTask as ScheduledTask
from orchestrator.store.schedules import ScheduleKind as ScheduleKind
from orchestrator.store.schedules import TaskState as TaskState
from orchestrator.store.schedules import claim_due_time, due_tasks, insert_task, rewrite_task, set_task_state
from orchestrator.store.schedules import get_task as get_task
from orchestrator.store.schedules import list_tasks as list_tasks
from orchestrator.store.traces import record_trace

log = logging.getLogger(__name__)

SCHEDULER_SENDER = SENDER_SCHEDULER
_INTERVAL = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([smhd]?)\s*$")
_UNIT_S = {"": 1, "s": 1, "m": 60, "h": 3600, "d": 86400}
# The longest interval: a year (a longer one overflowed the date-times it is added to).
MAX_INTERVAL_S = 366 * 86400


def parse_interval(text: str) -> float:
    """``90``, ``45s``, ``30m``, ``2h``, ``1d`` -> seconds (at least 1, at most a year)."""
    m = _INTERVAL.match(text)
    if not m:
        raise InvalidMessage(f"interval {text!r}: use a number with an optional unit s, m, h or d (e.g. 30m)")
    seconds = float(m.group(1)) * _UNIT_S[m.group(2)]
    if seconds < 1:
        raise InvalidMessage(f"interval {text!r} is shorter than one second")
    if seconds > MAX_INTERVAL_S:
        raise InvalidMessage(f"interval {text!r} is longer than a year (366d); use a cron line or a time once")
    return seconds


def _parse_once(text: str) -> datetime:
    try:
        at = datetime.fromisoformat(text)
        return at.replace(tzinfo=UTC) if at.tzinfo is None else at.astimezone(UTC)
    except ValueError:
        raise InvalidMessage(f"time {text!r} is not an ISO-8601 date-time") from None
    except OverflowError:  # in UTC, past the year 9999
        raise InvalidMessage(f"time {text!r} is out of range") from None


def next_due(kind: str, spec: str, after: datetime) -> datetime | None:
    """The first due time strictly after ``after`` (None: never again)."""
    if kind == "cron":
        try:
            return croniter(spec, after).get_next(datetime).astimezone(UTC)
        except CroniterBadDateError:  # a day that never comes (31 February), a year gone by
            return None
    if kind == "interval":
        return after + timedelta(seconds=parse_interval(spec))
    at = _parse_once(spec)
    return at if at > after else None


def add_task(
    db: Database,
    *,
    chat_jid: str,
    prompt: str,
    kind: ScheduleKind,
    spec: str,
    context_mode: ContextMode = "group",
    now: datetime | None = None,
    made_by_agent: bool = False,
) -> ScheduledTask:
    """Validate and store a task; bad input raises InvalidMessage, unknown groups UnknownGroup."""
    get_group(db, chat_jid)
    if not prompt.strip():
        raise InvalidMessage("a scheduled task needs a prompt")
    if context_mode not in ("group", "isolated"):
        raise InvalidMessage(f"context mode {context_mode!r}: use 'group' or 'isolated'")
    now = now or datetime.now(UTC)
    first = first_due(kind, spec, now)
    return insert_task(
        db,
        task_id=str(uuid.uuid4()),
        chat_jid=chat_jid,
        prompt=prompt,
        kind=kind,
        spec=spec,
        context_mode=context_mode,
        next_run_at=first,
        created_at=now,
        made_by_agent=made_by_agent,
    )


def first_due(kind: str, spec: str, now: datetime) -> datetime:
    """A new schedule's first due time after ``now``; InvalidMessage for one that is no
    schedule or never falls due."""
    if kind == "cron":
        if not croniter.is_valid(spec):
            raise InvalidMessage(f"cron line {spec!r} is not valid (five fields: minute hour day month weekday)")
        first = next_due(kind, spec, now)
        if first is None:
            raise InvalidMessage(f"cron line {spec!r} never falls due")
        return first
    if kind == "interval":
        return now + timedelta(seconds=parse_interval(spec))
    if kind == "once":
        at = _parse_once(spec)
        if at <= now:
            raise InvalidMessage(f"time {spec!r} is in the past")
        return at
    raise InvalidMessage(f"schedule kind {kind!r}: use cron, interval or once")


def cron_fields(spec: str) -> int:
    """How many fields the valid cron line ``spec`` has (an alias such as ``@hourly``: five);
    a sixth is seconds, a seventh the year."""
    return len(croniter(spec).expanded)


def shortest_cron_gap_s(spec: str) -> float:
    """A lower bound, in seconds, of the time between two consecutive due times of the valid
    five-field cron line ``spec``: the shortest step between the minutes of a day it fires
    at, the step over midnight counted as if the next day fired too.  The day, month and
    weekday fields only leave days out, which makes gaps longer, never shorter; the due
    times are UTC, so no clock change shortens one either."""
    minute, hour = croniter(spec).expanded[:2]
    minutes = range(60) if "*" in minute else [int(m) for m in minute]
    hours = range(24) if "*" in hour else [int(h) for h in hour]
    times = sorted({h * 60 + m for h in hours for m in minutes})
    steps = [later - earlier for earlier, later in itertools.pairwise(times)]
    steps.append(times[0] + 1440 - times[-1])
    return 60.0 * min(steps)


def change_task(
    db: Database,
    task_id: str,
    *,
    prompt: str | None = None,
    kind: ScheduleKind | None = None,
    spec: str | None = None,
    now: datetime | None = None,
) -> ScheduledTask:
    """A task's new prompt and/or schedule (kind and spec together); a cancelled or done task
    is a Conflict, bad input InvalidMessage (nothing changed)."""
    task = get_task(db, task_id)
    if task.state not in ("active", "paused"):
        raise Conflict(f"task {task.id[:8]} is {task.state}; it cannot change")
    if prompt is not None and not prompt.strip():
        raise InvalidMessage("a scheduled task needs a prompt")
    if (kind is None) != (spec is None):
        raise InvalidMessage("a new schedule needs its kind and its spec together")
    following = task.next_run_at
    if kind is not None and spec is not None:
        following = first_due(kind, spec, now or datetime.now(UTC))
    rewrite_task(
        db,
        task.id,
        prompt=prompt if prompt is not None else task.prompt,
        kind=kind or task.kind,
        spec=spec if spec is not None else task.spec,
        next_run_at=following,
    )
    return get_task(db, task.id)


_TRANSITIONS: dict[str, tuple[set[str], TaskState]] = {
    "pause": ({"active"}, "paused"),
    "resume": ({"paused"}, "active"),
    "cancel": ({"active", "paused"}, "cancelled"),
}


def change_state(db: Database, task_id: str, action: str, *, now: datetime | None = None) -> ScheduledTask:
    """pause / resume / cancel a task; NotFound for no such task, Conflict for a change its
    state does not allow."""
    task = get_task(db, task_id)
    allowed, target = _TRANSITIONS[action]
    if task.state not in allowed:
        raise Conflict(f"task {task.id[:8]} is {task.state}; cannot {action} it")
    following = None
    if action == "resume":
        # Resuming does not fire everything that fell due while paused.
        now = now or datetime.now(UTC)
        nxt = task.next_run_at
        if task.kind != "once" and (nxt is None or nxt <= now):
            following = next_due(task.kind, task.spec, now)
    set_task_state(db, task.id, target, next_run_at=following)
    return get_task(db, task.id)


def fire_due(db: Database, *, signal: Callable[[str], object] | None, now: datetime | None = None) -> list[str]:
    """Fire every active task that is due; returns the ids of the messages stored."""
    now = now or datetime.now(UTC)
    due = due_tasks(db, now)
    fired: list[str] = []
    for task in due:
        # With tracing on, each firing is the trace of a message that wakes the agent,
        # like ingest's (orchestrator/core/tracing.py): kept with the message for its run.
        with tracing.span(
            "scheduled task",
            parent=tracing.ROOT,
            attributes={"orchestrator.chat_jid": task.chat_jid, "orchestrator.task_id": task.id},
        ):
            stored = _fire(db, task, now, signal)
        if stored is not None:
            fired.append(stored)
    return fired


def _fire(db: Database, task: ScheduledTask, now: datetime, signal: Callable[[str], object] | None) -> str | None:
    """Fire ``task``'s due time: the id of the message stored, None when another ticker had."""
    assert task.next_run_at is not None
    following = next_due(task.kind, task.spec, max(now, task.next_run_at))
    msg = NewMessage(
        id=f"sched-{task.id}-{int(task.next_run_at.timestamp())}",
        chat_jid=task.chat_jid,
        sender=SCHEDULER_SENDER,
        sender_name="scheduled task",
        content=task.prompt,
        timestamp=now_iso(),
        metadata={"scheduled_task": task.id, "due": task.next_run_at.isoformat(), "context_mode": task.context_mode},
    )
    # Claim the due time, store its message and mark the group pending in
    # one transaction: a crash leaves either all of it or none.
    with db.write() as session:
        if not claim_due_time(session, task, following=following, now=now):
            return None  # another ticker fired this due time
        stored, created = insert_message(session, db, msg)
        if created:
            mark_pending(session, task.chat_jid, stored.seq)
            record_deliveries(session, stored)  # shown on the group's channels (the sweeper signals)
            trace = tracing.traceparent()  # "" while tracing is off
            if trace:
                record_trace(session, stored.seq, trace)
    if not created:
        return None
    tracing.annotate(message_id=stored.id, seq=stored.seq)
    if signal is not None:
        try:
            signal(task.chat_jid)
        except Exception as exc:  # noqa: BLE001 - the sweeper re-signals pending groups
            log.warning(
                "could not signal a worker for task %s in %s (%s); the sweeper will", task.id[:8], task.chat_jid, exc
            )
    return stored.id


def is_isolated(metadata: dict[str, object] | None) -> bool:
    """True for the message of a scheduled task that runs without the group's context."""
    if not metadata:
        return False
    return metadata.get("scheduled_task") is not None and metadata.get("context_mode") == "isolated"
