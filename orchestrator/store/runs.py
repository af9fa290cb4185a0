"""Agent run records: one row per run, with state, timings and usage.

A run created, or its state or attempt changed, wakes its chat's open streams when the
change commits (store/chat_wakeups.py): on PostgreSQL in the fixed statements' own
``RETURNING``, no round trip of its own."""

from __future__ import annotations

import uuid
from collections.abc import Collection
from dataclasses import dataclass
from datetime import datetime
from typing import Annotated, Any, Literal, get_args

from pydantic import BaseModel, ConfigDict
from sqlalchemy import ColumnElement, Connection, and_, or_, select, update
from sqlalchemy.orm import Session, defer

from orchestrator.core import secrets
from orchestrator.core.errors import NotFound
from orchestrator.store.chat_wakeups import NOTIFY_RETURNING, chat_changed
from orchestrator.store.db import Database, age_text, changed_rows, db_now, db_time, driver_execute, now_text
from orchestrator.store.stored_literals import checked, column_check
from orchestrator.store.tables import GroupChannelRow, GroupRow, RunRow

# "awaiting_answer": the run ended by asking its group a question (orchestrator/run/questions.py);
# final like the others (its slot and lease let go of), the question open on the group.
RunState = Literal["queued", "running", "succeeded", "awaiting_answer", "failed", "timed_out", "cancelled"]
RUN_STATES: tuple[RunState, ...] = get_args(RunState)
FINAL_STATES: frozenset[RunState] = frozenset({"succeeded", "awaiting_answer", "failed", "timed_out", "cancelled"})
# The ends of a run that did what it was asked: no error to tell the chat.
GOOD_ENDS: frozenset[RunState] = frozenset({"succeeded", "awaiting_answer"})
# A run not ended yet: waiting for its container or retry, or running.
LIVE_STATES: tuple[RunState, ...] = ("queued", "running")


class Run(BaseModel):
    model_config = ConfigDict(frozen=True)

    id: str
    chat_jid: str
    state: Annotated[RunState, column_check(RUN_STATES, "runs.state")]
    attempts: int
    cursor_from: int
    cursor_to: int
    celery_task_id: str | None
    owner: str | None = None
    container_id: str | None
    input_tokens: int
    output_tokens: int
    error: str | None
    created_at: datetime
    started_at: datetime | None
    finished_at: datetime | None
    duration_s: float | None
    input_sha256: str | None = None
    # A queued run waiting for its next attempt: when it is due (None otherwise).
    retry_at: datetime | None = None
    # A replay (orchestrator/run/replay.py): the run whose recorded input it ran again; None for a chat run.
    replay_of: str | None = None


@dataclass(frozen=True)
class RecordedInput:
    """A run's input as recorded: ``compressed`` (the bytes, zlib-compressed) and ``digest``
    (their SHA-256 before compression)."""

    digest: str
    compressed: bytes


def new_run_id() -> str:
    return str(uuid.uuid4())


def _to_run(row: RunRow) -> Run:
    return Run.model_validate(row, from_attributes=True)


# A run's columns for the driver's fixed reads (never the recorded input, a blob).
RUN_COLUMNS = (
    "id",
    "chat_jid",
    "state",
    "attempts",
    "cursor_from",
    "cursor_to",
    "celery_task_id",
    "owner",
    "container_id",
    "input_tokens",
    "output_tokens",
    "error",
    "created_at",
    "started_at",
    "finished_at",
    "duration_s",
    "input_sha256",
    "retry_at",
    "replay_of",
)
_TIMES = ("created_at", "started_at", "finished_at", "retry_at")


def run_from_values(values: tuple[Any, ...]) -> Run:
    """A :class:`Run` from a fixed read's row of :data:`RUN_COLUMNS` (the driver's own values)."""
    row = dict(zip(RUN_COLUMNS, values, strict=True))
    for name in _TIMES:
        row[name] = db_time(row[name])
    return Run.model_validate(row)


_UNFINISHED = (
    f"SELECT {', '.join(RUN_COLUMNS)} FROM runs WHERE chat_jid = :chat_jid AND finished_at IS NULL ORDER BY created_at"
)


def unfinished_runs(db: Database, chat_jid: str) -> list[Run]:
    """The chat's runs that have not ended, oldest first (replays included): what the
    pipeline's step reads once after taking the lease, for the runs a dead holder left
    (``sweeper.recover_group``) and the one parked for its retry (:func:`parked_of`).
    One fixed read on the driver (``idx_runs_chat_created``); usually it finds nothing."""
    return [run_from_values(tuple(row)) for row in db.read_fixed(_UNFINISHED, {"chat_jid": chat_jid})]


def parked_of(runs: list[Run]) -> Run | None:
    """Of a chat's unfinished runs (oldest first), the one that waits for its next attempt."""
    return next((run for run in runs if run.retry_at is not None), None)


def create_run(
    db: Database,
    *,
    chat_jid: str,
    cursor_from: int,
    cursor_to: int,
    celery_task_id: str | None,
    owner: str | None = None,
    run_id: str | None = None,
    recorded: RecordedInput | None = None,
    container_id: str | None = None,
) -> Run:
    """A new ``queued`` run, as :func:`add_run` makes it, in a transaction of its own: one
    fixed INSERT on the driver, its times the database's now in the statement (once a run
    with no fleet cap: docs/performance.md, "The control plane"), its input with it when
    ``recorded`` (the pipeline builds it first: one write less), ``running`` on
    ``container_id`` when given (the warm container it goes to: another write less)."""
    run_id = run_id or new_run_id()
    state: RunState = "running" if container_id else "queued"
    with db.transaction() as conn:
        created = driver_execute(
            conn,
            _CREATE[db.is_sqlite],
            {
                "id": run_id,
                "chat_jid": chat_jid,
                "cursor_from": cursor_from,
                "cursor_to": cursor_to,
                "celery_task_id": celery_task_id,
                "owner": owner,
                "digest": None if recorded is None else recorded.digest,
                "data": None if recorded is None else recorded.compressed,
                "state": state,
                "container_id": container_id,
            },
        ).fetchone()[0]
        if db.is_sqlite:
            chat_changed(conn, chat_jid)
    at = db_time(created)
    assert at is not None  # a NOT NULL column, just written
    return Run(
        id=run_id,
        chat_jid=chat_jid,
        state=state,
        attempts=1,
        cursor_from=cursor_from,
        cursor_to=cursor_to,
        celery_task_id=celery_task_id,
        owner=owner,
        container_id=container_id,
        input_tokens=0,
        output_tokens=0,
        error=None,
        created_at=at,
        started_at=at,
        finished_at=None,
        duration_s=None,
    )


def _create_sql(*, sqlite: bool) -> str:
    now = now_text(sqlite=sqlite)
    return (
        "INSERT INTO runs (id, chat_jid, state, attempts, cursor_from, cursor_to, celery_task_id, owner, "
        "input_tokens, output_tokens, created_at, started_at, input_sha256, input_json, container_id) "
        f"VALUES (:id, :chat_jid, :state, 1, :cursor_from, :cursor_to, :celery_task_id, :owner, 0, 0, {now}, {now}, "
        ":digest, :data, :container_id) "
        "RETURNING created_at" + ("" if sqlite else f", {NOTIFY_RETURNING}")
    )


_CREATE = {sqlite: _create_sql(sqlite=sqlite) for sqlite in (True, False)}


def add_run(
    session: Session,
    *,
    chat_jid: str,
    cursor_from: int,
    cursor_to: int,
    celery_task_id: str | None,
    owner: str | None = None,
    run_id: str | None = None,
    recorded: RecordedInput | None = None,
    container_id: str | None = None,
) -> Run:
    """A new ``queued`` run, added in the caller's transaction (``store/slots.py``
    admits a run under the fleet's cap and adds its row in one), with its input when
    ``recorded``, ``running`` on ``container_id`` when given (:func:`create_run`).  Its
    times are the database's: the quotas count runs against the database's hour,
    whichever host made them (``store/usage.py``)."""
    now = db_now(session)
    row = RunRow(
        id=run_id or new_run_id(),
        chat_jid=chat_jid,
        state="running" if container_id else "queued",
        container_id=container_id,
        attempts=1,
        cursor_from=cursor_from,
        cursor_to=cursor_to,
        celery_task_id=celery_task_id,
        owner=owner,
        input_tokens=0,
        output_tokens=0,
        created_at=now,
        started_at=now,
        input_sha256=None if recorded is None else recorded.digest,
        input_json=None if recorded is None else recorded.compressed,
    )
    session.add(row)
    chat_changed(session, chat_jid)
    return _to_run(row)


def set_container(db: Database, run_id: str, container_id: str) -> None:
    """The run's container is up: the run is ``running`` (unless already cancelled).

    One UPDATE, no read first: a round trip less per run (bench/control_plane.py), and a
    cancel committed between a read and the write could not be written over."""
    with db.transaction() as conn:
        row = driver_execute(conn, _SET_CONTAINER[db.is_sqlite], {"run_id": run_id, "container_id": container_id})
        found = row.fetchone()
        if db.is_sqlite and found is not None:
            chat_changed(conn, found[0])


# Once a run: fixed SQL on the driver (docs/performance.md, "The control plane").
_SET_CONTAINER = {
    sqlite: "UPDATE runs SET container_id = :container_id, "
    "state = CASE WHEN state = 'queued' THEN 'running' ELSE state END WHERE id = :run_id "
    f"RETURNING {'chat_jid' if sqlite else NOTIFY_RETURNING}"
    for sqlite in (True, False)
}


def park_run(
    db: Database,
    run_id: str,
    *,
    attempts: int,
    error: str | None,
    retry_at: datetime,
    input_tokens: int,
    output_tokens: int,
) -> Run:
    """A failed attempt, to be retried at ``retry_at``: the run waits ``queued``,
    holding no lease and no worker slot, with what it has spent so far."""
    with db.write() as session:
        row = session.get(RunRow, run_id)
        if row is None:
            raise NotFound(f"no run {run_id!r}")
        row.attempts = attempts
        row.error = secrets.redact(error) if error else error  # an error's text may quote anything
        row.container_id = None
        row.retry_at = retry_at
        row.input_tokens, row.output_tokens = input_tokens, output_tokens
        if row.state == "running":
            row.state = "queued"  # a cancel that came meanwhile stays
        chat_changed(session, row.chat_jid)
        return _to_run(row)


def resume_run(db: Database, run_id: str, *, owner: str, celery_task_id: str | None) -> None:
    """A parked run's next attempt starts: no longer waiting, owned by this pipeline."""
    with db.write() as session:
        session.execute(
            update(RunRow).where(RunRow.id == run_id).values(retry_at=None, owner=owner, celery_task_id=celery_task_id)
        )


def cancel_run(db: Database, run_id: str) -> Run:
    """Mark a run cancelled; its worker sees this and stops the container.

    Raises NotFound for an unknown run; a run that already ended keeps its
    state (the returned run says which).
    """
    run = get_run(db, run_id)
    with db.write() as session:
        cancelled = session.execute(
            update(RunRow)
            .where(RunRow.id == run.id, RunRow.state.in_(("queued", "running")))
            .values(state="cancelled", error="cancelled by request")
        )
        if changed_rows(cancelled):
            chat_changed(session, run.chat_jid)
    return get_run(db, run.id)


def run_state(db: Database, run_id: str) -> RunState | None:
    """The run's state (None: no such run)."""
    with db.read() as session:
        state = session.scalar(select(RunRow.state).where(RunRow.id == run_id))
    return None if state is None else checked(RUN_STATES, state, "runs.state")


def finish_run(
    db: Database,
    run_id: str,
    *,
    state: RunState,
    error: str | None = None,
    input_tokens: int = 0,
    output_tokens: int = 0,
    conn: Connection | None = None,
) -> Run:
    """End the run (unless something ended it first: that verdict stands, and the run
    comes back as it is; a cancel request outranks how it ended), in the caller's
    transaction ``conn`` (the pipeline's run end) or in one of its own.

    Fixed SQL on the driver, the end and the duration on the database's clock (the one
    ``started_at`` was taken from): once a run, it was an ORM unit of work and a read of
    the clock (docs/performance.md, "The control plane")."""
    if conn is None:
        with db.transaction() as own:
            return finish_run(
                db, run_id, state=state, error=error, input_tokens=input_tokens, output_tokens=output_tokens, conn=own
            )
    params = {
        "run_id": run_id,
        "state": state,
        "error": secrets.redact(error) if error else error,
        "input_tokens": input_tokens,
        "output_tokens": output_tokens,
    }
    row = driver_execute(conn, _FINISH[db.is_sqlite], params).fetchone()
    if row is None:  # ended already, or no such run
        row = driver_execute(conn, _RUN_BY_ID, {"run_id": run_id}).fetchone()
        if row is None:
            raise NotFound(f"no run {run_id!r}")
        return run_from_values(tuple(row))
    run = run_from_values(tuple(row)[: len(RUN_COLUMNS)])  # PostgreSQL's wake-up after the columns
    if db.is_sqlite:
        chat_changed(conn, run.chat_jid)
    return run


def _finish_sql(*, sqlite: bool) -> str:
    now = now_text(sqlite=sqlite)
    return (
        f"UPDATE runs SET state = CASE WHEN state = 'cancelled' THEN state ELSE :state END, "
        f"error = CASE WHEN state = 'cancelled' THEN error ELSE :error END, "
        f"input_tokens = :input_tokens, output_tokens = :output_tokens, retry_at = NULL, finished_at = {now}, "
        f"duration_s = {age_text('started_at', sqlite=sqlite)} "
        f"WHERE id = :run_id AND finished_at IS NULL RETURNING {', '.join(RUN_COLUMNS)}"
        + ("" if sqlite else f", {NOTIFY_RETURNING}")
    )


_FINISH = {sqlite: _finish_sql(sqlite=sqlite) for sqlite in (True, False)}
_RUN_BY_ID = f"SELECT {', '.join(RUN_COLUMNS)} FROM runs WHERE id = :run_id"


def get_run(db: Database, run_id: str) -> Run:
    with db.read() as session:
        row = session.get(RunRow, run_id)
        if row is None:
            # Let people paste a unique prefix of the id (% and _ in it are taken literally).
            rows = list(session.scalars(select(RunRow).where(RunRow.id.startswith(run_id, autoescape=True)).limit(2)))
            if len(rows) != 1:
                raise NotFound(f"no run {run_id!r}")
            row = rows[0]
        return _to_run(row)


def list_runs(
    db: Database,
    *,
    chat_jid: str | None = None,
    state: str | None = None,
    limit: int = 50,
    chat_runs_only: bool = False,
) -> list[Run]:
    """The newest runs first; ``chat_runs_only``: without replays (orchestrator/run/replay.py),
    for what reads a chat's own runs (its notices, the terminal chat, ``send --wait``)."""
    # Not the recorded input (a blob per run): listings never show it.
    stmt = select(RunRow).options(defer(RunRow.input_json)).order_by(RunRow.created_at.desc()).limit(limit)
    if chat_jid:
        stmt = stmt.where(RunRow.chat_jid == chat_jid)
    if chat_runs_only:
        stmt = stmt.where(RunRow.replay_of.is_(None))
    if state:
        stmt = stmt.where(RunRow.state == state)
    with db.read() as session:
        return [_to_run(r) for r in session.scalars(stmt)]


# Read on the driver before every run (its notices, orchestrator/run/notices.py): the ORM's
# list_runs was a millisecond of each run's CPU (docs/performance.md, "The control plane").
_RECENT_ENDS = (
    "SELECT state, error, finished_at FROM runs WHERE chat_jid = :chat_jid AND replay_of IS NULL "
    "ORDER BY created_at DESC LIMIT :limit"
)


def recent_run_ends(db: Database, chat_jid: str, limit: int = 5) -> list[tuple[RunState, str | None, datetime | None]]:
    """(state, error, finished_at) of the chat's ``limit`` newest runs (not replays), newest first:
    one fixed read."""
    rows = db.read_fixed(_RECENT_ENDS, {"chat_jid": chat_jid, "limit": limit})
    return [
        (checked(RUN_STATES, state, "runs.state"), error, db_time(finished_at)) for state, error, finished_at in rows
    ]


# -- the input a run's container was given (exact bytes, zlib-compressed, and their SHA-256) ---

# Once a run: fixed SQL on the driver (docs/performance.md, "The control plane").
_SAVE_INPUT = "UPDATE runs SET input_sha256 = :digest, input_json = :data WHERE id = :run_id"


def save_input(db: Database, run_id: str, recorded: RecordedInput) -> None:
    """Record the run's input, in a transaction of its own (a replay's; a chat run's is
    written with its row)."""
    db.write_fixed(_SAVE_INPUT, {"digest": recorded.digest, "data": recorded.compressed, "run_id": run_id})


def recorded_input(db: Database, run_id: str) -> bytes | None:
    """The run's recorded input as stored (zlib-compressed; None: none recorded); NotFound
    for no such run."""
    with db.read() as session:
        row = session.execute(select(RunRow.input_json).where(RunRow.id == run_id)).first()
    if row is None:
        raise NotFound(f"no run {run_id!r}")
    return row[0]


def run_cursors(db: Database, run_id: str) -> tuple[int, int]:
    """The run's (cursor_from, cursor_to): the messages it answered; NotFound for no such run."""
    with db.read() as session:
        run = session.get(RunRow, run_id)
        if run is None:
            raise NotFound(f"no run {run_id!r}")
        return run.cursor_from, run.cursor_to


def runs_changed(
    db: Database, chat_jid: str, *, live: Collection[str], since: datetime | None
) -> list[tuple[str, RunState, int, datetime]]:
    """(id, state, attempts, created_at) of the chat's runs (not replays: the page never shows
    one) that are live now, or in ``live`` (live when last seen), or created at or after
    ``since``: what the chat's event stream looks at on each tick (orchestrator/http/stream.py)."""
    cond: list[ColumnElement[bool]] = [RunRow.state.in_(LIVE_STATES)]
    if live:
        cond.append(RunRow.id.in_(live))
    if since is not None:
        cond.append(RunRow.created_at >= since)
    stmt = select(RunRow.id, RunRow.state, RunRow.attempts, RunRow.created_at).where(
        RunRow.chat_jid == chat_jid,
        RunRow.replay_of.is_(None),
        or_(*cond),
    )
    with db.read() as session:
        rows = session.execute(stmt).all()
    return [
        (run_id, checked(RUN_STATES, state, "runs.state"), attempts, created_at)
        for run_id, state, attempts, created_at in rows
    ]


@dataclass(frozen=True, slots=True)
class RunningOn:
    """A running run of a group attached to a channel, with where the channel shows the group."""

    run_id: str
    chat_jid: str
    cursor_to: int
    address: str  # the attachment's address, or the group's chat id
    assistant_name: str | None  # the group's own (None: the settings')


def running_on(db: Database, channel: str) -> list[RunningOn]:
    """The running runs (not replays) of the groups attached to ``channel``."""
    stmt = (
        select(
            RunRow.id,
            RunRow.chat_jid,
            RunRow.cursor_to,
            GroupChannelRow.address,
            GroupChannelRow.chat_jid,
            GroupRow.assistant_name,
        )
        .join(GroupChannelRow, and_(GroupChannelRow.chat_jid == RunRow.chat_jid, GroupChannelRow.channel == channel))
        .join(GroupRow, GroupRow.chat_jid == RunRow.chat_jid)
        .where(RunRow.state == "running", RunRow.replay_of.is_(None))
    )
    with db.read() as session:
        rows = session.execute(stmt).all()
    return [RunningOn(r[0], r[1], r[2], r[3] or r[4], r[5]) for r in rows]
