"""What dead workers and lost signals leave behind, as the database shows it: the reads of
the sweeper (``orchestrator/run/sweeper.py``) and of every worker's recovery watch
(``orchestrator/run/recovery.py``), which decide what to do about it.

A lease's holder is gone when ``leases.holder_gone`` says so at ``now``, the database's
time (the clock the expiries are written on): no holder, expired, or held on a host the
hosts table gives up for dead.
"""

from __future__ import annotations

from datetime import datetime

from sqlalchemy import and_, or_, select

from orchestrator.store.db import Database, db_now
from orchestrator.store.hosts import on_dead_host
from orchestrator.store.leases import holder_gone
from orchestrator.store.tables import GroupRow, RunRow


def held_leases(db: Database) -> list[tuple[str, str | None, bool]]:
    """(group, holder, gone) of every held lease, by group: ``gone`` as the database judges
    the holder now (a pid of this machine is the caller's to judge)."""
    with db.read() as session:
        now = db_now(session)
        rows = session.execute(
            select(GroupRow.chat_jid, GroupRow.lease_owner, holder_gone(now).label("gone"))
            .where(GroupRow.lease_owner.is_not(None))
            .order_by(GroupRow.chat_jid)
        ).all()
    return [(chat_jid, holder, bool(gone)) for chat_jid, holder, gone in rows]


def stale_runs(db: Database, now: datetime) -> list[tuple[str, str, int]]:
    """(run, group, cursor_to) of every unfinished chat run whose worker is gone at ``now``: its
    group's lease is dead or held by another owner.  Neither a parked run (it waits for its
    retry holding no lease, on purpose) nor a replay (it holds no lease) is one."""
    with db.read() as session:
        rows = session.execute(
            select(RunRow.id, RunRow.chat_jid, RunRow.cursor_to)
            .join(GroupRow, GroupRow.chat_jid == RunRow.chat_jid)
            .where(
                RunRow.state.in_(("queued", "running", "cancelled")),
                RunRow.finished_at.is_(None),
                RunRow.retry_at.is_(None),
                RunRow.replay_of.is_(None),
                or_(holder_gone(now), and_(RunRow.owner.is_not(None), GroupRow.lease_owner != RunRow.owner)),
            )
        ).all()
    return [(run_id, chat_jid, cursor_to) for run_id, chat_jid, cursor_to in rows]


def lost_replays(db: Database, now: datetime) -> list[str]:
    """The unfinished replays whose worker's host is dead at ``now`` (nothing else ends them)."""
    with db.read() as session:
        return list(
            session.scalars(
                select(RunRow.id).where(
                    RunRow.replay_of.is_not(None), RunRow.finished_at.is_(None), on_dead_host(RunRow.owner, now)
                )
            )
        )


def unsignalled_groups(db: Database, now: datetime) -> list[str]:
    """The groups with pending work and no live lease holder at ``now``, but for those whose
    parked run is not due yet (its own signal has a countdown)."""
    with db.read() as session:
        return list(
            session.scalars(
                select(GroupRow.chat_jid).where(
                    GroupRow.pending_seq > GroupRow.cursor_seq,
                    holder_gone(now),
                    GroupRow.chat_jid.not_in(
                        select(RunRow.chat_jid).where(
                            RunRow.retry_at > now, RunRow.state == "queued", RunRow.finished_at.is_(None)
                        )
                    ),
                )
            )
        )


def live_run_ids(db: Database) -> set[str]:
    """Runs that have not finished: their containers must be left alone."""
    with db.read() as session:
        return set(session.scalars(select(RunRow.id).where(RunRow.finished_at.is_(None))))
