"""One run per group at a time, across every worker and host.

A lease is (owner, expiry) on the group row, taken with a conditional UPDATE
that works the same on SQLite and PostgreSQL: it succeeds only if the lease is
free, expired, or held by a process of a dead host (``hosts.on_dead_host``).
The holder renews it from a heartbeat thread; a holder that dies simply stops
renewing and the lease expires.

**The database's clock, never a host's.**  Taking a lease writes its expiry
as the database's now plus the ttl in the statement itself (``store/db.py``'s
``later_text``); renewing reads the database's now in its own transaction
(``db_now``) and writes the expiry from it; expiry is compared with the same
clock, so a worker
whose clock runs an hour ahead neither steals live leases nor writes ones that
never expire.  The :class:`~orchestrator.core.clock.Clock` a
:class:`Heartbeat` is handed only paces its beats (tests jump it).

**A holder gone from this host is replaced at once.**  Owners are
``host_id:pid:nonce`` (``hosts.process_owner``).  When the lease is held,
unexpired, by a process of the acquirer's own host that no longer runs
(SIGKILLed; ``hosts.gone_from_this_host``), :func:`acquire` takes it over with
a conditional UPDATE naming that owner, and logs it.  What the dead holder
left (its unfinished run) is the caller's to close before it runs anything:
``orchestrator/run/sweeper.py``'s ``recover_group``.

**A holder whose process is gone is replaced in seconds, from any host.**  Each process
that takes leases keeps a liveness token (``store/liveness.py``: a PostgreSQL session of
its own, or on SQLite an ``flock``); when the holder's token is gone and it has not
renewed the lease for :data:`TAKE_OVER_AFTER_S` (``groups.lease_renewed_at``), any
acquirer takes it over the same way.  A holder alive renews every :data:`RENEW_EVERY_S`,
so a session the server ended under a live process never costs it its lease.

**A lost lease stores nothing.**  A holder that was taken for dead (its host
silent past the liveness window: a pause, a partition) may still be running
when it comes back.  Everything the pipeline stores for a run checks, in the
same write transaction, that the lease is still its own (:func:`fence`), so a
worker whose group was taken over stops at its next output instead of
answering beside the new holder.

**The taker is the place.**  ``take(place=host_id)`` (the pipeline's step)
places a group that has no live place on the acquirer's host in the same
UPDATE (``orchestrator/store/placement.py``).
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from datetime import datetime, timedelta

from sqlalchemy import ColumnElement, Connection, case, literal, or_, select, update
from sqlalchemy.orm import Session

from orchestrator.core.clock import SYSTEM_CLOCK, Clock
from orchestrator.core.errors import LeaseLost
from orchestrator.core.spare_threads import SPARE
from orchestrator.store import liveness
from orchestrator.store.db import Database, changed_rows, db_now, driver_execute, later_text, now_text
from orchestrator.store.groups import GROUP_COLUMNS, Group, get_group, group_from_values
from orchestrator.store.hosts import (
    ALIVE_WINDOW_S,
    dead_owner_sql,
    gone_from_this_host,
    on_dead_host,
    owner_host,
    owner_process,
    place_sql,
    takes_groups,
)
from orchestrator.store.tables import GroupRow

log = logging.getLogger(__name__)


def holder_gone(now: datetime) -> ColumnElement[bool]:
    """SQL: the group's lease has no live holder at ``now`` (the database's time):
    none, expired, or held by a process of a host that is stopped or silent."""
    return or_(GroupRow.lease_owner.is_(None), GroupRow.lease_expires_at < now, on_dead_host(GroupRow.lease_owner, now))


def acquire(db: Database, chat_jid: str, owner: str, ttl_s: float, *, place: str | None = None) -> bool:
    """Take ``chat_jid``'s lease for ``owner`` (True) or find it held (False); see :func:`take`."""
    return take(db, chat_jid, owner, ttl_s, place=place) is not None


def take(db: Database, chat_jid: str, owner: str, ttl_s: float, *, place: str | None = None) -> Group | None:
    """Take ``chat_jid``'s lease for ``owner`` and read the group in the same statement
    (None: the lease is held by another, or there is no such group).

    ``place``: the acquirer's host id (the pipeline's): the group is placed on
    it in the same statement unless it is placed on another host that takes
    groups now (``orchestrator/store/placement.py``), so the host that takes a
    group without a live place becomes its place, and a move sticks.

    One fixed UPDATE ... RETURNING on the driver, the expiry and the holder's
    liveness on the database's clock in the statement itself: once a run, it
    was a transaction of two ORM statements and a read of the group after
    (docs/performance.md, "The control plane").  Only a holder that is gone
    from this host takes the slower way (:func:`_take_over`)."""
    params = {"chat_jid": chat_jid, "owner": owner, "ttl": float(ttl_s), "window": ALIVE_WINDOW_S, "place": place}
    host_id = owner_host(owner)
    if host_id is not None:
        liveness.ensure(db, host_id)  # before it holds a lease: its death is then seen at once
    with db.transaction() as conn:
        row = driver_execute(conn, _TAKE[db.is_sqlite, place is not None], params).fetchone()
    if row is not None:
        return group_from_values(tuple(row))
    return _take_over(db, chat_jid, owner, ttl_s, place)


def _take_sql(*, sqlite: bool, place: bool) -> str:
    placed = f", placed_host = COALESCE({place_sql(sqlite=sqlite)}, :place)" if place else ""
    return (
        f"UPDATE groups SET lease_owner = :owner, lease_expires_at = {later_text('ttl', sqlite=sqlite)}, "
        f"lease_renewed_at = {now_text(sqlite=sqlite)}{placed} "
        f"WHERE chat_jid = :chat_jid AND (lease_owner = :owner OR lease_owner IS NULL "
        f"OR lease_expires_at < {now_text(sqlite=sqlite)} OR {dead_owner_sql('groups.lease_owner', sqlite=sqlite)}) "
        f"RETURNING {', '.join(GROUP_COLUMNS)}"
    )


# (SQLite?, placing?): the statement :func:`take` sends.
_TAKE = {(sqlite, place): _take_sql(sqlite=sqlite, place=place) for sqlite in (True, False) for place in (True, False)}


def _take_over(db: Database, chat_jid: str, owner: str, ttl_s: float, place: str | None) -> Group | None:
    """The lease is held, unexpired, by a live host's process: take it over (and read the
    group) if that process is one of this host's that no longer runs, or one whose liveness
    token is gone and which has stopped renewing (:func:`gone_holders`), else None."""
    with db.read() as session:
        holder = session.scalar(select(GroupRow.lease_owner).where(GroupRow.chat_jid == chat_jid))
    host_id = owner_host(owner)
    if holder is None or host_id is None:
        return None
    if gone_from_this_host(holder, host_id):
        why, quiet = "that process no longer runs on this host", None
    elif (chat_jid, holder) in gone_holders(db, [(chat_jid, holder)]):
        why, quiet = "that process is gone (its liveness token) and stopped renewing", TAKE_OVER_AFTER_S
    else:
        return None
    with db.write() as session:
        now = db_now(session)
        values: dict[str, object] = {
            "lease_owner": owner,
            "lease_expires_at": now + timedelta(seconds=ttl_s),
            "lease_renewed_at": now,
        }
        if place is not None and quiet is not None:
            # Its host may look alive a while yet, and the group's signals go to its queue:
            # the taker, which runs the group now, is its place.
            values["placed_host"] = place
        elif place is not None:
            values["placed_host"] = case(
                (takes_groups(GroupRow.placed_host, now), GroupRow.placed_host), else_=literal(place)
            )
        held = [GroupRow.chat_jid == chat_jid, GroupRow.lease_owner == holder]
        if quiet is not None:  # still quiet now: a renewal since the look keeps it its holder's
            held.append(GroupRow.lease_renewed_at < now - timedelta(seconds=quiet))
        result = session.execute(update(GroupRow).where(*held).values(**values))
        if changed_rows(result) != 1:
            return None
    log.warning("took over the lease of %s from %s: %s", chat_jid, holder, why)
    return get_group(db, chat_jid)


def gone_holders(db: Database, held: list[tuple[str, str]]) -> set[tuple[str, str]]:
    """Of ``held`` (group, holder) leases, those whose holder's liveness token is gone
    (``store/liveness.py``) and which it has not renewed for :data:`TAKE_OVER_AFTER_S`, while
    the database server has run long enough for live holders to have made theirs again."""
    processes = {(jid, holder): p for jid, holder in held if (p := owner_process(holder)) is not None}
    if not processes:
        return set()
    # The cheap look first: a live holder renews every RENEW_EVERY_S, so this is mostly empty.
    with db.read() as session:
        now = db_now(session)
        rows = session.execute(
            select(GroupRow.chat_jid, GroupRow.lease_owner).where(
                GroupRow.chat_jid.in_([jid for jid, _ in processes]),
                GroupRow.lease_renewed_at < now - timedelta(seconds=TAKE_OVER_AFTER_S),
            )
        ).all()
    quiet = {(jid, holder) for jid, holder in rows}
    processes = {k: p for k, p in processes.items() if k in quiet}
    tokens = liveness.tokens_of(db, processes.values()) if processes else {}
    candidates = {k: tokens[p] for k, p in processes.items() if p in tokens}
    if not candidates:
        return set()
    dead = liveness.gone(db, candidates.values())
    if not dead or not liveness.server_settled(db):
        return set()
    return {k for k, token in candidates.items() if token in dead}


def renew(db: Database, chat_jid: str, owner: str, ttl_s: float) -> bool:
    with db.write() as session:
        now = db_now(session)
        result = session.execute(
            update(GroupRow)
            .where(GroupRow.chat_jid == chat_jid, GroupRow.lease_owner == owner)
            .values(lease_expires_at=now + timedelta(seconds=ttl_s), lease_renewed_at=now)
        )
        return changed_rows(result) == 1


def fence(session: Session | Connection, chat_jid: str, owner: str) -> None:
    """Raise :class:`LeaseLost` unless ``owner`` holds ``chat_jid``'s lease: called in the
    write transaction that stores a run's output, so nothing is stored by a holder
    that another worker replaced.  An expired lease nobody took is still the holder's."""
    # Fixed SQL on the driver, in the caller's transaction: before every stored output.
    conn = session.connection() if isinstance(session, Session) else session
    row = driver_execute(conn, _HOLDER, {"chat_jid": chat_jid}).fetchone()
    holder = None if row is None else row[0]
    if holder != owner:
        raise LeaseLost(f"{chat_jid}'s lease is {'free' if holder is None else 'held by ' + holder} now, not {owner}'s")


_RELEASE = (
    "UPDATE groups SET lease_owner = NULL, lease_expires_at = NULL "
    "WHERE chat_jid = :chat_jid AND lease_owner = :owner RETURNING pending_seq, cursor_seq"
)
_HOLDER = "SELECT lease_owner FROM groups WHERE chat_jid = :chat_jid"


def release(db: Database, chat_jid: str, owner: str) -> tuple[int, int] | None:
    """Let go of ``chat_jid``'s lease if ``owner`` holds it: the group's pending mark and
    cursor as the release left them (None: not ``owner``'s lease).  The pipeline's step
    decides from them whether work is left: read in the releasing statement, nothing
    ingested after it bounced off this lease.  Fixed SQL on the driver."""
    with db.transaction() as conn:
        row = driver_execute(conn, _RELEASE, {"chat_jid": chat_jid, "owner": owner}).fetchone()
    return None if row is None else (int(row[0]), int(row[1]))


def marks(db: Database, chat_jid: str) -> tuple[int, int]:
    """``chat_jid``'s pending mark and cursor, read now (after a step whose release was not
    this holder's to make: the run's end let go of the lease, or another took it)."""
    group = get_group(db, chat_jid)
    return group.pending_seq, group.cursor_seq


# -- a run's end on the group row: fixed SQL on the driver, in the caller's transaction ------


def _end_hold_sql(session: bool) -> str:
    keep = ", session_id = :session_id" if session else ""
    return (
        "UPDATE groups SET cursor_seq = CASE WHEN cursor_seq < :cursor_to THEN :cursor_to ELSE cursor_seq END"
        f"{keep}, lease_owner = NULL, lease_expires_at = NULL WHERE chat_jid = :chat_jid AND lease_owner = :owner "
        "RETURNING pending_seq, cursor_seq"
    )


# Keeping the session?: the statement :func:`end_hold` sends.
_END_HOLD = {session: _end_hold_sql(session) for session in (True, False)}


def end_hold(conn: Connection, chat_jid: str, owner: str, cursor_to: int, session_id: str | None) -> tuple[int, int]:
    """A run's end on the group row, in the caller's transaction: the cursor past ``cursor_to``
    (never back) and the session kept, and ``owner``'s lease let go of, in one statement;
    the pending mark and cursor it leaves.  :class:`LeaseLost` if the lease is not
    ``owner``'s (the fence of the run's end: nothing of it is to be committed)."""
    params: dict[str, object] = {"chat_jid": chat_jid, "owner": owner, "cursor_to": cursor_to}
    if session_id:
        params["session_id"] = session_id
    row = driver_execute(conn, _END_HOLD[bool(session_id)], params).fetchone()
    if row is None:
        raise LeaseLost(f"{chat_jid}'s lease is no longer {owner}'s at its run's end")
    return int(row[0]), int(row[1])


_MOVE_CURSOR = "UPDATE groups SET cursor_seq = :cursor_to WHERE chat_jid = :chat_jid AND cursor_seq < :cursor_to"
_MOVE_CURSOR_SESSION = (
    "UPDATE groups SET cursor_seq = :cursor_to, session_id = :session_id "
    "WHERE chat_jid = :chat_jid AND cursor_seq < :cursor_to"
)


def move_cursor(conn: Connection, chat_jid: str, cursor_to: int, session_id: str | None) -> None:
    """Move ``chat_jid``'s cursor past ``cursor_to`` (never back), and keep ``session_id`` if
    given, in the caller's transaction (the lease holder's, with nothing to run)."""
    params: dict[str, object] = {"chat_jid": chat_jid, "cursor_to": cursor_to}
    if session_id:
        params["session_id"] = session_id
    driver_execute(conn, _MOVE_CURSOR_SESSION if session_id else _MOVE_CURSOR, params)


# A held lease is renewed this often (or every ttl/3, if sooner): a renewal is also
# how the holder learns it still reaches the database, and how others know it runs.
RENEW_EVERY_S = 0.5
# A holder whose liveness token is gone is taken over once it has not renewed for this
# long (three renewals missed): a live holder whose session the server ended keeps it.
TAKE_OVER_AFTER_S = 1.5
# Renewals failing (or hanging) this long make the holder give its run up (``lost``):
# cut off from the database, its host's own heartbeat fails too, and after
# ALIVE_WINDOW_S another host takes the group; the run's container must be
# stopped before that host's starts on the same workspace.
UNSURE_AFTER_S = ALIVE_WINDOW_S / 2


class LostSignal(threading.Event):
    """An Event that also calls the functions registered with :meth:`on_set` when it is set:
    a run's stop-watch kills its container from the thread that finds the lease lost,
    with no thread of its own polling the event."""

    def __init__(self) -> None:
        super().__init__()
        self._calls: list[Callable[[], object]] = []
        self._calls_lock = threading.Lock()

    def set(self) -> None:
        super().set()
        with self._calls_lock:
            calls = list(self._calls)
        for call in calls:
            call()

    def on_set(self, call: Callable[[], object]) -> Callable[[], None]:
        """Call ``call`` once the event is set (now, if it is); returns what unregisters it."""
        with self._calls_lock:
            self._calls.append(call)
        if self.is_set():
            call()

        def forget() -> None:
            with self._calls_lock:
                if call in self._calls:
                    self._calls.remove(call)

        return forget


class Heartbeat:
    """Renews a lease every ``min(ttl/3, RENEW_EVERY_S)`` seconds (waited on ``clock``)
    until stopped; each renewal sets the expiry from the database's now.

    ``lost`` is set when another holder has the lease, or when no renewal has
    succeeded for :data:`UNSURE_AFTER_S` (real) seconds: a guard thread of its
    own sees that even while a renewal hangs on a database that is away.
    """

    def __init__(
        self,
        db: Database,
        chat_jid: str,
        owner: str,
        ttl_s: float,
        *,
        clock: Clock = SYSTEM_CLOCK,
    ) -> None:
        self._db, self._jid, self._owner, self._ttl = db, chat_jid, owner, ttl_s
        self._clock = clock
        self._stop = threading.Event()
        self.lost = LostSignal()
        self._renewed = time.monotonic()  # the lease was just taken

    def __enter__(self) -> Heartbeat:
        self._thread = SPARE.start(self._beat, f"lease-{self._jid}")
        self._guard = SPARE.start(self._watch, f"lease-guard-{self._jid}")
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._guard.join()
        # A renewal hanging on a database that is away must not hold the run's end:
        # the thread is a daemon, and its late answer changes nothing.
        self._thread.join(timeout=UNSURE_AFTER_S)

    def _beat(self) -> None:
        while not self._clock.wait(self._stop, min(self._ttl / 3, RENEW_EVERY_S)):
            try:
                if not renew(self._db, self._jid, self._owner, self._ttl):
                    self.lost.set()
                    return
                self._renewed = time.monotonic()
            except Exception:  # a transient DB error: try again next beat
                log.warning("could not renew the lease of %s; trying again next beat", self._jid, exc_info=True)

    def _watch(self) -> None:
        while not self._stop.wait(0.2):
            silent = time.monotonic() - self._renewed
            if silent > UNSURE_AFTER_S:
                log.error(
                    "the lease of %s was not renewed for %.1fs (the database is away?): giving the run up "
                    "before another host may take the group",
                    self._jid,
                    silent,
                )
                self.lost.set()
                return
