"""Placement: the one worker host a group's runs go to (issue 14).

A group is placed on one host, ``groups.placed_host``: the host that took
its lease when the group had no live place (``leases.take(place=...)``,
in the same statement, called by the pipeline's step), or the host
``orchestrator groups move`` named (:func:`move`).  A signal for the group
goes to that host's own Celery queue (``orchestrator/run/queue.py``:
``host_queue``; every agent worker consumes its own queue and the shared one)
while the host takes groups (``hosts.takes_groups``: ``up``, not draining
nor stopped, and beaten within ``hosts.ALIVE_WINDOW_S`` by the database's
clock); otherwise to the shared queue, and the host that takes the lease
there becomes the place.  So a group's runs, its warm container and its
workspace's cache stay on one host, and a host that is gone, stopped or
draining holds no group: the group follows the next host that serves it.

A placed host that takes a lease does not lose the place to a stray signal on
the shared queue (a host that is not the place may still run a step; the
lease is what makes a run unique, placement only steers the signals).

What needs no column of its own: a draining host is no place (its groups'
signals go to the shared queue at once), and :func:`stranded` finds the
groups whose signal may sit in the queue of a host that no longer takes
groups (the workers' recovery watch signals them again, on the shared queue).
"""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict
from sqlalchemy import and_, select, update
from sqlalchemy.orm import Session

from orchestrator.core.errors import HostUnavailable, UnknownGroup
from orchestrator.store.db import Database, db_now, driver_execute
from orchestrator.store.hosts import ALIVE_WINDOW_S, owner_host, place_sql, takes_groups, up_and_beating
from orchestrator.store.leases import holder_gone
from orchestrator.store.tables import GroupRow, HostRow


class Moved(BaseModel):
    """What ``groups move`` did."""

    model_config = ConfigDict(frozen=True)

    chat_jid: str
    host: str
    previous_host: str | None
    # Work was pending: the group is signalled on its new host.
    pending: bool
    signalled: bool = False


# Built with SQLAlchemy's expressions and an ORM session, the look-up cost ~2 ms on SQLite.
_PLACED_SQLITE = f"SELECT {place_sql(sqlite=True)} FROM groups WHERE chat_jid = :chat_jid"
_PLACED_PG = f"SELECT {place_sql(sqlite=False)} FROM groups WHERE chat_jid = :chat_jid"


def placed_on(db: Database, chat_jid: str) -> str | None:
    """The host ``chat_jid``'s signals go to: its place while that host takes groups
    (``hosts.takes_groups``), else None (the shared queue).  One fixed statement on
    the driver (the group and its host, each by primary key) on the database's
    clock, no write lock.  Ingest reads the same in its own transaction instead."""
    with db.engine.connect() as conn:
        row = driver_execute(
            conn, _PLACED_SQLITE if db.is_sqlite else _PLACED_PG, {"chat_jid": chat_jid, "window": ALIVE_WINDOW_S}
        ).fetchone()
    return None if row is None or row[0] is None else str(row[0])


def live_hosts(db: Database) -> list[str]:
    """The hosts groups may be placed on now, by id."""
    with db.read() as session:
        return _live(session)


def _live(session: Session) -> list[str]:
    now = db_now(session)
    return list(session.scalars(select(HostRow.host_id).where(up_and_beating(now)).order_by(HostRow.host_id)))


def move(db: Database, chat_jid: str, host_id: str) -> Moved:
    """Place ``chat_jid`` on ``host_id``, which must take groups now (else
    :class:`HostUnavailable`, nothing changed).  A run in progress elsewhere
    finishes there; the group's next signal goes to ``host_id``.  The caller
    signals the group when ``pending``; the old host stops the group's warm
    container by itself (``sandbox/warm/tending.py``: ``WarmPool.tend``)."""
    with db.write() as session:
        row = session.get(GroupRow, chat_jid)
        if row is None:
            raise UnknownGroup(chat_jid)
        live = _live(session)
        if host_id not in live:
            raise HostUnavailable(host_id, live, ALIVE_WINDOW_S)
        previous, pending = row.placed_host, row.pending_seq > row.cursor_seq
        session.execute(update(GroupRow).where(GroupRow.chat_jid == chat_jid).values(placed_host=host_id))
    return Moved(chat_jid=chat_jid, host=host_id, previous_host=previous, pending=pending)


def stranded(db: Database) -> list[tuple[str, str]]:
    """(group, host) of the groups with pending work and no live lease holder that
    are placed on a host that does not take groups now (dead, stopped, draining or
    never seen): their last signal may sit in that host's queue, which nobody
    consumes.  Signalled again, they go to the shared queue."""
    with db.read() as session:
        now = db_now(session)
        rows = session.execute(
            select(GroupRow.chat_jid, GroupRow.placed_host)
            .where(
                GroupRow.placed_host.is_not(None),
                GroupRow.pending_seq > GroupRow.cursor_seq,
                holder_gone(now),
                ~takes_groups(GroupRow.placed_host, now),
            )
            .order_by(GroupRow.chat_jid)
        ).all()
    return [(jid, host) for jid, host in rows if host is not None]


def moved_away(db: Database, host_id: str, folders: list[str]) -> list[str]:
    """Of the group ``folders`` (this host's warm containers), those whose group is
    placed on another host and whose lease no process of ``host_id`` holds: their
    warm container here has no more runs coming."""
    if not folders:
        return []
    with db.read() as session:
        rows = session.execute(
            select(GroupRow.folder, GroupRow.lease_owner).where(
                GroupRow.folder.in_(folders), and_(GroupRow.placed_host.is_not(None), GroupRow.placed_host != host_id)
            )
        ).all()
    return [folder for folder, holder in rows if owner_host(holder) != host_id]
