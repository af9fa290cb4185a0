"""Scheduled tasks' rows: the ``scheduled_tasks`` table.

What a task is and when it falls due (cron lines, intervals, a time once; the states a
task may move between; firing) is ``orchestrator/run/schedules.py``'s; this module stores
and reads the rows it decides on.  A task's due time is claimed by a conditional UPDATE
(:func:`claim_due_time`, in the transaction that stores its message), so one due time
fires once however many beat processes tick.
"""

from __future__ import annotations

from datetime import datetime
from typing import Annotated, Literal, get_args

from pydantic import BaseModel, ConfigDict
from sqlalchemy import func, select, update
from sqlalchemy.orm import Session

from orchestrator.core.errors import NotFound
from orchestrator.store.db import Database, changed_rows, db_time
from orchestrator.store.stored_literals import checked, column_check
from orchestrator.store.tables import ScheduledTaskRow

ScheduleKind = Literal["cron", "interval", "once"]
ContextMode = Literal["group", "isolated"]
TaskState = Literal["active", "paused", "cancelled", "done"]
KINDS: tuple[ScheduleKind, ...] = get_args(ScheduleKind)
CONTEXT_MODES: tuple[ContextMode, ...] = get_args(ContextMode)
TASK_STATES: tuple[TaskState, ...] = get_args(TaskState)


class ScheduledTask(BaseModel):
    model_config = ConfigDict(frozen=True, from_attributes=True)

    id: str
    chat_jid: str
    prompt: str
    kind: Annotated[ScheduleKind, column_check(KINDS, "scheduled_tasks.kind")]
    spec: str
    context_mode: Annotated[ContextMode, column_check(CONTEXT_MODES, "scheduled_tasks.context_mode")]
    state: Annotated[TaskState, column_check(TASK_STATES, "scheduled_tasks.state")]
    next_run_at: datetime | None
    last_run_at: datetime | None
    runs: int
    created_at: datetime
    made_by_agent: bool = False


def insert_task(
    db: Database,
    *,
    task_id: str,
    chat_jid: str,
    prompt: str,
    kind: ScheduleKind,
    spec: str,
    context_mode: ContextMode,
    next_run_at: datetime | None,
    created_at: datetime,
    made_by_agent: bool = False,
) -> ScheduledTask:
    """Store a new ``active`` task (checked by the caller) in a transaction of its own."""
    row = ScheduledTaskRow(
        id=task_id,
        chat_jid=chat_jid,
        prompt=prompt,
        kind=kind,
        spec=spec,
        context_mode=context_mode,
        state="active",
        next_run_at=next_run_at,
        runs=0,
        created_at=created_at,
        made_by_agent=made_by_agent,
    )
    with db.write() as session:
        session.add(row)
    return ScheduledTask.model_validate(row)


def agent_task_count(db: Database, chat_jid: str) -> int:
    """The group's tasks the agent made that are still active or paused."""
    with db.read() as session:
        return int(
            session.scalar(
                select(func.count())
                .select_from(ScheduledTaskRow)
                .where(
                    ScheduledTaskRow.chat_jid == chat_jid,
                    ScheduledTaskRow.made_by_agent.is_(True),
                    ScheduledTaskRow.state.in_(("active", "paused")),
                )
            )
            or 0
        )


def rewrite_task(
    db: Database, task_id: str, *, prompt: str, kind: ScheduleKind, spec: str, next_run_at: datetime | None
) -> None:
    """A task's prompt and schedule (checked by the caller), with its next due time."""
    with db.write() as session:
        session.execute(
            update(ScheduledTaskRow)
            .where(ScheduledTaskRow.id == task_id)
            .values(prompt=prompt, kind=kind, spec=spec, next_run_at=next_run_at)
        )


def list_tasks(db: Database, *, chat_jid: str | None = None) -> list[ScheduledTask]:
    """Every task (of one chat), oldest first."""
    stmt = select(ScheduledTaskRow).order_by(ScheduledTaskRow.created_at)
    if chat_jid:
        stmt = stmt.where(ScheduledTaskRow.chat_jid == chat_jid)
    with db.read() as session:
        return [ScheduledTask.model_validate(r) for r in session.scalars(stmt)]


def get_task(db: Database, task_id: str) -> ScheduledTask:
    """The task whose id is or starts with ``task_id`` (its ``%`` and ``_`` taken as they
    are); NotFound for none or several."""
    with db.read() as session:
        rows = list(
            session.scalars(
                select(ScheduledTaskRow).where(ScheduledTaskRow.id.startswith(task_id, autoescape=True)).limit(2)
            )
        )
    if len(rows) != 1:
        raise NotFound(f"no scheduled task {task_id!r}" if not rows else f"task id {task_id!r} is ambiguous")
    return ScheduledTask.model_validate(rows[0])


class TaskCounts(BaseModel):
    """A group's scheduled tasks by state."""

    model_config = ConfigDict(frozen=True)

    active: int = 0
    paused: int = 0
    done: int = 0
    cancelled: int = 0


def count_tasks(db: Database, chat_jid: str) -> TaskCounts:
    """How many of the chat's tasks are in each state."""
    stmt = (
        select(ScheduledTaskRow.state, func.count())
        .where(ScheduledTaskRow.chat_jid == chat_jid)
        .group_by(ScheduledTaskRow.state)
    )
    with db.read() as session:
        rows = session.execute(stmt).all()
    return TaskCounts(**{checked(TASK_STATES, state, "scheduled_tasks.state"): int(n) for state, n in rows})


def set_task_state(db: Database, task_id: str, state: TaskState, *, next_run_at: datetime | None = None) -> None:
    """The task is now in ``state`` (and due at ``next_run_at`` when given)."""
    values: dict[str, object] = {"state": state}
    if next_run_at is not None:
        values["next_run_at"] = next_run_at
    with db.write() as session:
        session.execute(update(ScheduledTaskRow).where(ScheduledTaskRow.id == task_id).values(**values))


def due_tasks(db: Database, now: datetime) -> list[ScheduledTask]:
    """The active tasks due at ``now``."""
    with db.read() as session:
        return [
            ScheduledTask.model_validate(r)
            for r in session.scalars(
                select(ScheduledTaskRow).where(ScheduledTaskRow.state == "active", ScheduledTaskRow.next_run_at <= now)
            )
        ]


def claim_due_time(session: Session, task: ScheduledTask, *, following: datetime | None, now: datetime) -> bool:
    """Claim ``task``'s due time (``task.next_run_at``) in the caller's transaction: it moves on
    to ``following`` (None: the task is done).  False when another ticker claimed it first."""
    claimed = changed_rows(
        session.execute(
            update(ScheduledTaskRow)
            .where(
                ScheduledTaskRow.id == task.id,
                ScheduledTaskRow.next_run_at == task.next_run_at,
                ScheduledTaskRow.state == "active",
            )
            .values(
                next_run_at=following,
                last_run_at=now,
                runs=ScheduledTaskRow.runs + 1,
                state="active" if following is not None else "done",
            )
        )
    )
    return claimed == 1


# Read on the driver before every run (its notices): the ORM's list_tasks was a
# millisecond of each run's CPU (docs/performance.md, "The control plane").
_LIVE_COLUMNS = (
    "id, chat_jid, prompt, kind, spec, context_mode, state, next_run_at, last_run_at, runs, created_at, made_by_agent"
)
_LIVE_TASKS = f"SELECT {_LIVE_COLUMNS} FROM scheduled_tasks WHERE state IN ('active', 'paused') ORDER BY created_at"
_LIVE_TASKS_OF = (
    f"SELECT {_LIVE_COLUMNS} FROM scheduled_tasks WHERE chat_jid = :chat_jid "
    "AND state IN ('active', 'paused') ORDER BY created_at"
)


def live_tasks(db: Database, chat_jid: str | None = None) -> list[ScheduledTask]:
    """The active and paused tasks (of one chat), oldest first: one fixed read, for the run
    path (what a run's agent may manage, and its due-soon notice)."""
    rows = db.read_fixed(_LIVE_TASKS_OF, {"chat_jid": chat_jid}) if chat_jid else db.read_fixed(_LIVE_TASKS)
    names = _LIVE_COLUMNS.split(", ")
    return [
        ScheduledTask.model_validate(
            {
                **dict(zip(names, row, strict=True)),
                "next_run_at": db_time(row[7]),
                "last_run_at": db_time(row[8]),
                "created_at": db_time(row[10]),
                "made_by_agent": bool(row[11]),
            }
        )
        for row in rows
    ]
