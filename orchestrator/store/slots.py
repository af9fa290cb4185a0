"""The fleet's run cap: at most ``ORCHESTRATOR_MAX_CONCURRENT_RUNS`` runs at once
across every worker of every host, admitted by the database (0: no cap, and
nothing here runs a query).

**The run row is the slot.**  A run holds one from the moment its row is
created (``queued``) until it ends (``finished_at``), a run parked for its
retry included: its next attempt neither waits behind the cap nor pushes the
fleet over it.  :func:`take_slot` decides and creates the row in one
serialized transaction (PostgreSQL: a transaction-scoped advisory lock on a
constant key, taken first and held to the commit; SQLite: the IMMEDIATE
write transaction already excludes every other writer), so two workers never
both take the last slot.  A run whose worker died keeps its slot until it is
closed (``sweeper.recover_group`` or the sweep), after its container is removed.

**Over the cap nothing starts.**  The group is recorded in ``run_waits``
(since when, on the database's clock) and :class:`FleetFull` tells the
pipeline to let go; the task comes back in :data:`RECHECK_S` seconds, a
backstop: the step that ends a run signals the groups next in line at once
(:func:`to_wake`).

**Priority lanes.**  Waiting groups rank by: a person's message waiting (a
``user`` message after the group's cursor that is neither the harness's nor
the scheduler's) before scheduled tasks only; then the main group before
the others; then the oldest wait.  The rank is read from the group's pending
messages each time, so a person who writes into a group whose scheduled task
waits moves it up.  A group takes a free slot only if fewer waiting groups
rank above it than slots are free: with 20 scheduled runs waiting, a
person's message starts in the next slot that frees.

A wait counts while its group still has messages pending, has no unfinished
run and asked again within :data:`STALE_S` (a waiting group asks every
:data:`RECHECK_S`, and the sweeper re-signals pending groups): a group that
stopped asking (its worker gone, its steps failing) holds the others back
for a minute at most.
"""

from __future__ import annotations

import logging
from datetime import datetime, timedelta
from typing import Literal

from pydantic import BaseModel, ConfigDict
from sqlalchemy import ColumnElement, and_, delete, exists, false, func, not_, or_, select, text, update
from sqlalchemy.orm import Session

from orchestrator.core.errors import FleetFull, ReplayLimited
from orchestrator.model.messages import HARNESS_SENDER_TYPES, SENDER_SCHEDULER
from orchestrator.store.db import Database, changed_rows, db_now
from orchestrator.store.runs import RecordedInput, Run, add_run, create_run
from orchestrator.store.tables import GroupRow, MessageRow, RunRow, RunWaitRow

log = logging.getLogger(__name__)

# A waiting group asks again after this many seconds (a backstop: a run that
# ends signals the next in line at once).
RECHECK_S = 5.0
# A wait whose group has not asked for this long no longer holds others back.
STALE_S = 60.0
# Serializes admissions on PostgreSQL (one-key space: 726931 migrations, 726932 seq).
_PG_ADMISSION_LOCK = "SELECT pg_advisory_xact_lock(726934)"
# Unfinished runs, parked ones included: each holds a slot.
_UNFINISHED = ("queued", "running", "cancelled")
# Senders whose messages are no person's.
_NOT_PEOPLE = (*sorted(HARNESS_SENDER_TYPES), SENDER_SCHEDULER)

Lane = Literal["person", "scheduled"]


class SlotWait(BaseModel):
    """A group whose next run waits for a slot: its rank and place in the line."""

    model_config = ConfigDict(frozen=True)

    chat_jid: str
    # "person": a person's message is among its pending ones; "scheduled": scheduled tasks only.
    lane: Lane
    is_main: bool
    # When it first found no slot, and how long ago that was (the database's clock).
    since: datetime
    waited_s: float
    # 1: the next to start when a slot frees.
    position: int


class FleetSlots(BaseModel):
    """The cap, the slots taken and the line (``orchestrator runs waiting``, ``GET /api/runs/waiting``)."""

    model_config = ConfigDict(frozen=True)

    # ORCHESTRATOR_MAX_CONCURRENT_RUNS (0: no cap).
    cap: int
    # Unfinished runs (parked ones included): the slots taken.
    running: int
    # The waiting groups, best ranked first.
    waiting: list[SlotWait]


def _person_waiting() -> ColumnElement[bool]:
    """SQL, per group row: a person's message lies after its cursor, up to its pending mark."""
    return exists().where(
        MessageRow.chat_jid == GroupRow.chat_jid,
        MessageRow.seq > GroupRow.cursor_seq,
        MessageRow.seq <= GroupRow.pending_seq,
        MessageRow.message_type == "user",
        MessageRow.is_from_me == false(),
        MessageRow.superseded_at.is_(None),
        MessageRow.sender.not_in(_NOT_PEOPLE),
    )


def _running(session: Session) -> int:
    return session.execute(
        select(func.count())
        .select_from(RunRow)
        # A replay (orchestrator/run/replay.py) holds a slot once a worker started it
        # (take_replay_slot), not while it is queued.
        .where(
            RunRow.state.in_(_UNFINISHED),
            RunRow.finished_at.is_(None),
            or_(RunRow.replay_of.is_(None), RunRow.owner.is_not(None)),
        )
    ).scalar_one()


_Ranked = tuple[str, Lane, bool, datetime]


def _line(session: Session, now: datetime, including: str | None = None) -> list[_Ranked]:
    """The waiting groups that count (and ``including``, waiting or not), best ranked first:
    (chat_jid, lane, is_main, since); a group not waiting yet waits from ``now``."""
    has_run = exists().where(
        RunRow.chat_jid == GroupRow.chat_jid,
        RunRow.state.in_(_UNFINISHED),
        RunRow.finished_at.is_(None),
        RunRow.replay_of.is_(None),
    )
    counts = and_(
        RunWaitRow.chat_jid.is_not(None),
        RunWaitRow.seen_at > now - timedelta(seconds=STALE_S),
        GroupRow.pending_seq > GroupRow.cursor_seq,
        not_(has_run),
    )
    rows = session.execute(
        select(GroupRow.chat_jid, GroupRow.is_main, _person_waiting(), RunWaitRow.since)
        .select_from(GroupRow)
        .outerjoin(RunWaitRow, RunWaitRow.chat_jid == GroupRow.chat_jid)
        .where(counts if including is None else or_(counts, GroupRow.chat_jid == including))
    ).all()
    line: list[_Ranked] = [
        (jid, "person" if person else "scheduled", bool(is_main), now if since is None else since)
        for jid, is_main, person, since in rows
    ]
    line.sort(key=lambda r: (r[1] != "person", not r[2], r[3], r[0]))
    return line


def _wait(ranked: _Ranked, position: int, now: datetime) -> SlotWait:
    jid, lane, is_main, since = ranked
    return SlotWait(
        chat_jid=jid,
        lane=lane,
        is_main=is_main,
        since=since,
        waited_s=max(0.0, (now - since).total_seconds()),
        position=position,
    )


def take_slot(
    db: Database,
    cap: int,
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
    """A new ``queued`` run of ``chat_jid`` (``run_id``, its input ``recorded`` with it;
    ``running`` on ``container_id`` when given) if a slot is free for it, else :class:`FleetFull`.

    In one serialized transaction: count the slots taken, rank the group
    among the waiting ones, and either create the run (the slot; the group's
    wait ends) or record the wait (committed before the raise).  ``cap`` 0:
    no cap, the run is created as it always was.
    """
    if cap <= 0:
        return create_run(
            db,
            chat_jid=chat_jid,
            cursor_from=cursor_from,
            cursor_to=cursor_to,
            celery_task_id=celery_task_id,
            owner=owner,
            run_id=run_id,
            recorded=recorded,
            container_id=container_id,
        )
    with db.write() as session:
        if not db.is_sqlite:
            session.execute(text(_PG_ADMISSION_LOCK))
        now = db_now(session)
        # Waits of groups that stopped asking go (this group's own, if stale, starts afresh).
        session.execute(delete(RunWaitRow).where(RunWaitRow.seen_at <= now - timedelta(seconds=STALE_S)))
        running = _running(session)
        line = _line(session, now, including=chat_jid)
        ahead = next(i for i, ranked in enumerate(line) if ranked[0] == chat_jid)
        if running + ahead < cap:
            session.execute(delete(RunWaitRow).where(RunWaitRow.chat_jid == chat_jid))
            return add_run(
                session,
                chat_jid=chat_jid,
                cursor_from=cursor_from,
                cursor_to=cursor_to,
                celery_task_id=celery_task_id,
                owner=owner,
                run_id=run_id,
                recorded=recorded,
                container_id=container_id,
            )
        wait = _wait(line[ahead], ahead + 1, now)
        asked = session.execute(update(RunWaitRow).where(RunWaitRow.chat_jid == chat_jid).values(seen_at=now))
        if changed_rows(asked) == 0:
            session.add(RunWaitRow(chat_jid=chat_jid, since=now, seen_at=now))
    log.info(
        "run slots: %d of %d taken; %s waits (%s%s, position %d)",
        running,
        cap,
        chat_jid,
        wait.lane,
        ", main" if wait.is_main else "",
        wait.position,
    )
    raise FleetFull(wait, running, cap, RECHECK_S)


def take_replay_slot(db: Database, cap: int, *, run_id: str, owner: str) -> bool:
    """Take the queued replay ``run_id`` for ``owner`` and start it if a run slot is free for it:
    within the cap and behind every group that waits for one (a replay is an operator's tool;
    the chats come first).  False: it is not queued any more (taken, ended, cancelled).
    :class:`ReplayLimited` (raised once the replay is ``owner``'s, for the caller to end it):
    the fleet has no slot for it now.  Serialized as :func:`take_slot` is."""
    full: ReplayLimited | None = None
    with db.write() as session:
        if cap > 0 and not db.is_sqlite:
            session.execute(text(_PG_ADMISSION_LOCK))
        now = db_now(session)
        taken = session.execute(
            update(RunRow)
            .where(RunRow.id == run_id, RunRow.state == "queued", RunRow.owner.is_(None))
            .values(owner=owner, started_at=now)
        )
        if changed_rows(taken) != 1:
            return False
        if cap > 0:
            running, waiting = _running(session) - 1, len(_line(session, now))  # not counting itself
            if running + waiting >= cap:
                full = ReplayLimited(
                    f"the fleet's run slots are taken ({running} of {cap} running, {waiting} group(s) waiting; "
                    "ORCHESTRATOR_MAX_CONCURRENT_RUNS): a replay waits behind the chats; try again later",
                    RECHECK_S,
                )
    if full is not None:
        raise full
    return True


def leave_line(db: Database, cap: int, chat_jid: str) -> None:
    """``chat_jid`` no longer waits for a slot (it waits for a quota instead): it must not hold others back."""
    if cap > 0:
        with db.write() as session:
            session.execute(delete(RunWaitRow).where(RunWaitRow.chat_jid == chat_jid))


def to_wake(db: Database, cap: int) -> list[str]:
    """The waiting groups that may start now, best ranked first: as many as slots are free.

    What the step that ended a run signals, so a freed slot is taken at once
    (by the group it belongs to) instead of at the next re-check.
    """
    if cap <= 0:
        return []
    with db.read() as session:
        running = _running(session)
        if running >= cap:
            return []
        return [ranked[0] for ranked in _line(session, db_now(session))[: cap - running]]


def fleet_slots(db: Database, cap: int) -> FleetSlots:
    """The cap, the slots taken and the waiting groups in the order they will start."""
    with db.read() as session:
        now = db_now(session)
        running = _running(session)
        line = _line(session, now) if cap > 0 else []
    return FleetSlots(cap=cap, running=running, waiting=[_wait(ranked, i + 1, now) for i, ranked in enumerate(line)])
