"""The fleet's hosts: who runs workers, whether they are alive, what they hold.

Every worker process has a host identity (``ORCHESTRATOR_HOST_ID``, by
default the machine's hostname: ``Settings.effective_host_id``) and keeps one
row of ``hosts`` fresh from a :class:`HostHeartbeat` thread in its main
process: registered when the worker is ready (state ``up``), beaten every
:data:`HEARTBEAT_INTERVAL_S` seconds with the count of its warm containers,
``draining`` while a warm shutdown lets the running tasks finish, ``stopped``
when it is gone.

**The database's clock, never the host's.** ``started_at``, ``heartbeat_at``
and ``stopped_at`` are written as ``CURRENT_TIMESTAMP`` (SQLite:
``strftime('%Y-%m-%d %H:%M:%f', 'now')``, for milliseconds) by the statement
itself, and a heartbeat's age is computed in SQL against the same clock, so
hosts whose clocks disagree are still judged alike.  A host is alive while it
is not ``stopped`` and its heartbeat is younger than the window
(:data:`ALIVE_WINDOW_S`, 9 s, three beats of 3 s: a dead host is noticed
within 9 s).

What a host holds is read from the rows that name their owner as
``host_id:pid:nonce`` (:func:`process_owner`): the runs not yet final and
the groups whose lease it holds (not expired by the database's clock).

A second process with the same host id takes the row over (a restart after
a SIGKILL must not wait for the old row to die); the process it took the row
from sees its heartbeat refused, says so in its log and leaves the row alone
while the newcomer is alive, or until that one's process is gone from this
machine (then it takes the row back at its next beat).

**A dead host's leases are dead** (:func:`on_dead_host`): a group lease held
by a process of a host that is ``stopped`` or has not beaten for the window
may be taken before its own expiry (``orchestrator/store/leases.py``; the
sweeper closes its runs).  A lease held by a process of *this* host that no
longer runs (:func:`gone_from_this_host`: ``os.kill(pid, 0)`` and
``/proc``) is taken at once.  Both rely on host ids naming one machine each.

**Groups are placed only on hosts that take them** (:func:`takes_groups`:
``up``, not draining nor stopped, and beaten within the window;
``orchestrator/store/placement.py``).
"""

from __future__ import annotations

import logging
import os
import socket
import threading
import time
import uuid
from collections.abc import Callable
from datetime import datetime, timedelta
from typing import Annotated, Any, Literal, get_args

from pydantic import BaseModel, ConfigDict
from sqlalchemy import ColumnElement, Text, and_, exists, func, or_, select, update

from orchestrator.core.machine import machine_identity
from orchestrator.store.db import Database, age_sql, age_text, changed_rows, now_sql
from orchestrator.store.host_fence import SelfFence
from orchestrator.store.runs import FINAL_STATES, RUN_STATES, RunState
from orchestrator.store.stored_literals import checked, column_check
from orchestrator.store.tables import GroupRow, HostRow, RunRow

log = logging.getLogger(__name__)

# A worker beats this often ...
HEARTBEAT_INTERVAL_S = 3.0
# ... and is taken for dead once its last beat is older than this (three beats missed).
# A dead host's leases are taken over then (on_dead_host): with a 5 s command to
# redo, 9 s keeps another host's recovery within 20 s (bench/recovery.py; it was
# 15 s, which alone made it 20-23 s: docs/performance.md).
ALIVE_WINDOW_S = 9.0

HostState = Literal["up", "draining", "stopped"]
STATES: tuple[HostState, ...] = get_args(HostState)


class HostRun(BaseModel):
    """A run that is not final yet, on the host whose process owns it."""

    model_config = ConfigDict(frozen=True)

    id: str
    chat_jid: str
    state: Annotated[RunState, column_check(RUN_STATES, "runs.state")]


class Host(BaseModel):
    """A host as listed: its row, its liveness on the database's clock, what it holds."""

    model_config = ConfigDict(frozen=True)

    host_id: str
    state: Annotated[HostState, column_check(STATES, "hosts.state")]
    alive: bool
    # Seconds since its last heartbeat, by the database's clock.
    heartbeat_age_s: float
    hostname: str
    pid: int
    instance: str
    version: str
    concurrency: int
    warm_containers: int | None
    started_at: datetime
    heartbeat_at: datetime
    stopped_at: datetime | None
    runs: list[HostRun]
    # Chat ids of the groups whose lease the host holds.
    groups: list[str]
    # Chat ids of the groups placed on the host (orchestrator/store/placement.py):
    # their signals go to its queue while it is up and beating.
    placed: list[str] = []


# -- owners -----------------------------------------------------------------------


def process_owner(host_id: str) -> str:
    """A lease / run owner for this process: ``host_id:pid:nonce`` (unique per process and object)."""
    return f"{host_id}:{os.getpid()}:{uuid.uuid4().hex[:8]}"


def owner_host(owner: str | None) -> str | None:
    """The host id in an owner made by :func:`process_owner` (None: not such an owner)."""
    if not owner or owner.count(":") < 2:
        return None
    return owner.rsplit(":", 2)[0]


# -- the database's clock -----------------------------------------------------------


# The expressions are store/db.py's (``now_sql``, ``age_sql``): leases and
# delivery claims are on the same clock.
_db_now = now_sql
_age_s = age_sql


def database_now(db: Database) -> datetime:
    """What time the database says it is (aware, UTC)."""
    return db.now()


def on_dead_host(owner: Any, now: datetime) -> ColumnElement[bool]:
    """SQL: ``owner`` (a column of ``host_id:pid:nonce`` owners) names a host the
    hosts table gives up for dead at ``now`` (the database's time): ``stopped``,
    or no heartbeat for :data:`ALIVE_WINDOW_S`.  An owner of no listed host
    (``history:...``, a process that never registered) is never on a dead host.

    The host id is matched as an exact prefix followed by exactly two more
    ``:``-separated parts, as :func:`owner_host` reads it (a host id may hold
    colons, and ``LIKE`` would take ``_`` and ``%`` in one for wildcards).
    """
    prefix = func.length(HostRow.host_id) + 1
    rest = func.substr(owner, prefix + 1, type_=Text)
    return exists().where(
        func.substr(owner, 1, prefix, type_=Text) == HostRow.host_id + ":",
        rest.like("%:%"),
        ~rest.like("%:%:%"),
        or_(HostRow.state == "stopped", HostRow.heartbeat_at < now - timedelta(seconds=ALIVE_WINDOW_S)),
    )


def dead_owner_sql(owner: str, *, sqlite: bool) -> str:
    """:func:`on_dead_host` written out for the driver's fixed statements (``leases.take``):
    SQL true when ``owner`` (a column) names a host that is ``stopped`` or has not beaten
    for ``:window`` seconds by the database's now.  ``tests/host/test_leases.py`` holds
    the two forms to the same verdicts."""
    rest = f"substr({owner}, length(d.host_id) + 2)"
    return (
        f"EXISTS (SELECT 1 FROM hosts d WHERE substr({owner}, 1, length(d.host_id) + 1) = d.host_id || ':' "
        f"AND {rest} LIKE '%:%' AND {rest} NOT LIKE '%:%:%' "
        f"AND (d.state = 'stopped' OR {age_text('d.heartbeat_at', sqlite=sqlite)} > :window))"
    )


def up_and_beating(now: datetime | None = None, *, db: Database | None = None) -> ColumnElement[bool]:
    """SQL on a ``hosts`` row: groups may be placed on it (``orchestrator/store/placement.py``):
    ``up`` (not ``draining``, not ``stopped``) and beaten within :data:`ALIVE_WINDOW_S`.
    The beat's age against ``now`` (the database's time, read by the caller in its
    transaction), or, with ``db`` instead, against the database's now in the
    statement itself (one round trip)."""
    if now is not None:
        fresh = HostRow.heartbeat_at >= now - timedelta(seconds=ALIVE_WINDOW_S)
    else:
        assert db is not None, "give the database's now or the database"
        fresh = _age_s(db, HostRow.heartbeat_at) < ALIVE_WINDOW_S
    return and_(HostRow.state == "up", fresh)


def takes_groups(host_id: Any, now: datetime | None = None, *, db: Database | None = None) -> ColumnElement[bool]:
    """SQL: ``host_id`` (a column of another table, or a value) names a host that is
    :func:`up_and_beating`."""
    return exists().where(HostRow.host_id == host_id, up_and_beating(now, db=db))


def place_sql(*, sqlite: bool) -> str:
    """A scalar subquery on a ``groups`` row (``groups`` in the FROM): the host it is
    placed on if that host takes groups now, else NULL; the same test as
    :func:`takes_groups` (``up``, a beat younger than ``:window`` seconds by the
    database's now), written out for the driver's fixed statements: ingest's routing
    read (``groups.routing``, no round trip of its own), ``placement.placed_on``
    and ``leases.take``'s placement."""
    age = age_text("h.heartbeat_at", sqlite=sqlite)
    return (
        f"(SELECT h.host_id FROM hosts h WHERE h.host_id = groups.placed_host AND h.state = 'up' AND {age} < :window)"
    )


# -- processes of this host ------------------------------------------------------------


def owner_pid(owner: str | None) -> int | None:
    """The pid in an owner made by :func:`process_owner` (None: not such an owner)."""
    if owner_host(owner) is None:
        return None
    assert owner is not None
    pid = owner.rsplit(":", 2)[1]
    return int(pid) if pid.isdigit() else None


def owner_process(owner: str | None) -> tuple[str, int] | None:
    """(host id, pid) of an owner made by :func:`process_owner` (None: not such an owner)."""
    host_id, pid = owner_host(owner), owner_pid(owner)
    return None if host_id is None or pid is None else (host_id, pid)


def pid_running(pid: int) -> bool:
    """Whether process ``pid`` runs on this machine (a zombie does not: nobody may
    have reaped a SIGKILLed worker's pool child; a pid we may not signal does)."""
    if pid <= 0:
        return True  # not one process: never judged gone
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    try:
        with open(f"/proc/{pid}/stat", "rb") as fh:
            state = fh.read().rsplit(b")", 1)[1].split()[0]
    except (OSError, IndexError):
        return True  # no /proc to ask: kill(0) said it exists
    return state not in (b"Z", b"X")


def gone_from_this_host(owner: str | None, host_id: str) -> bool:
    """``owner`` is a process of ``host_id`` (this machine's host id) that no longer runs.

    Host ids must name one machine, one pid namespace: the pid is looked up
    here.  This process is never gone; a pid now reused by another process
    counts as running (the lease then waits for its expiry or the host's death).
    """
    if owner_host(owner) != host_id:
        return False
    pid = owner_pid(owner)
    return pid is not None and pid != os.getpid() and not pid_running(pid)


# -- the row ------------------------------------------------------------------------


def register(
    db: Database,
    *,
    host_id: str,
    instance: str,
    version: str,
    concurrency: int,
    warm_containers: int | None = None,
    hostname: str | None = None,
    pid: int | None = None,
    window_s: float = ALIVE_WINDOW_S,
    machine: str = "",
) -> None:
    """Make (or take over) ``host_id``'s row for this process: ``up``, started and beaten now;
    ``machine``: the machine it runs on (``core/machine.py``; empty: this one's)."""
    from sqlalchemy.dialects import postgresql, sqlite  # an upsert; only workers register

    now = _db_now(db)
    values: dict[str, object] = {
        "host_id": host_id,
        "instance": instance,
        "hostname": hostname or socket.gethostname(),
        "machine": machine_identity(machine),
        "pid": os.getpid() if pid is None else pid,
        "version": version,
        "concurrency": concurrency,
        "state": "up",
        "warm_containers": warm_containers,
        "started_at": now,
        "heartbeat_at": now,
        "stopped_at": None,
    }
    insert = sqlite.insert(HostRow) if db.is_sqlite else postgresql.insert(HostRow)
    stmt = insert.values(**values)
    stmt = stmt.on_conflict_do_update(
        index_elements=[HostRow.host_id], set_={k: stmt.excluded[k] for k in values if k != "host_id"}
    )
    with db.write() as session:
        before = session.execute(
            select(
                HostRow.instance,
                HostRow.pid,
                HostRow.hostname,
                HostRow.state,
                _age_s(db, HostRow.heartbeat_at).label("age"),
            ).where(HostRow.host_id == host_id)
        ).one_or_none()
        session.execute(stmt)
    if (
        before is not None
        and before.instance != instance
        and before.state != "stopped"
        and before.age < window_s
        and not (before.hostname == socket.gethostname() and not pid_running(before.pid))
    ):  # not a restart
        log.warning(
            "host id %r was held by a live process (pid %s on %s); this process (pid %s) takes it over: "
            "give each worker host its own ORCHESTRATOR_HOST_ID",
            host_id,
            before.pid,
            before.hostname,
            values["pid"],
        )


def heartbeat(
    db: Database,
    host_id: str,
    instance: str,
    *,
    warm_containers: int | None,
    draining: bool = False,
) -> bool:
    """Beat ``host_id``'s row for ``instance`` now; False if the row is not this process's (or stopped)."""
    values: dict[str, object] = {"heartbeat_at": _db_now(db), "warm_containers": warm_containers}
    if draining:
        values["state"] = "draining"
    with db.write() as session:
        result = session.execute(
            update(HostRow)
            .where(HostRow.host_id == host_id, HostRow.instance == instance, HostRow.state != "stopped")
            .values(**values)
        )
        return changed_rows(result) == 1


def mark_stopped(db: Database, host_id: str, instance: str) -> bool:
    """``host_id`` is gone (if the row is still ``instance``'s): state ``stopped``, ``stopped_at`` now."""
    with db.write() as session:
        result = session.execute(
            update(HostRow)
            .where(HostRow.host_id == host_id, HostRow.instance == instance)
            .values(state="stopped", stopped_at=_db_now(db))
        )
        return changed_rows(result) == 1


def list_hosts(db: Database, *, window_s: float = ALIVE_WINDOW_S) -> list[Host]:
    """Every host, by id: liveness (heartbeat younger than ``window_s`` by the database's clock),
    its runs that are not final yet, the groups whose lease it holds and those placed on it."""
    age = _age_s(db, HostRow.heartbeat_at).label("age")
    with db.read() as session:
        rows = session.execute(select(HostRow, age).order_by(HostRow.host_id)).all()
        runs = session.execute(
            select(RunRow.id, RunRow.chat_jid, RunRow.state, RunRow.owner)
            .where(RunRow.state.not_in(FINAL_STATES), RunRow.owner.is_not(None))
            .order_by(RunRow.created_at)
        ).all()
        leases = session.execute(
            select(GroupRow.chat_jid, GroupRow.lease_owner)
            .where(GroupRow.lease_owner.is_not(None), GroupRow.lease_expires_at > _db_now(db))
            .order_by(GroupRow.chat_jid)
        ).all()
        placements = session.execute(
            select(GroupRow.chat_jid, GroupRow.placed_host)
            .where(GroupRow.placed_host.is_not(None))
            .order_by(GroupRow.chat_jid)
        ).all()
    runs_of: dict[str, list[HostRun]] = {}
    for r in runs:
        runs_of.setdefault(owner_host(r.owner) or "", []).append(HostRun(id=r.id, chat_jid=r.chat_jid, state=r.state))
    groups_of: dict[str, list[str]] = {}
    for g in leases:
        groups_of.setdefault(owner_host(g.lease_owner) or "", []).append(g.chat_jid)
    placed_on: dict[str, list[str]] = {}
    for g in placements:
        placed_on.setdefault(g.placed_host, []).append(g.chat_jid)
    hosts = []
    for row, age_s in rows:
        age_s = max(0.0, float(age_s))
        hosts.append(
            Host.model_validate(
                {
                    "host_id": row.host_id,
                    "state": row.state,
                    "alive": row.state != "stopped" and age_s < window_s,
                    "heartbeat_age_s": round(age_s, 3),
                    "hostname": row.hostname,
                    "pid": row.pid,
                    "instance": row.instance,
                    "version": row.version,
                    "concurrency": row.concurrency,
                    "warm_containers": row.warm_containers,
                    "started_at": row.started_at,
                    "heartbeat_at": row.heartbeat_at,
                    "stopped_at": row.stopped_at,
                    "runs": runs_of.get(row.host_id, []),
                    "groups": groups_of.get(row.host_id, []),
                    "placed": placed_on.get(row.host_id, []),
                }
            )
        )
    return hosts


def gone_for(db: Database, host_ids: set[str], seconds: float) -> set[str]:
    """Those of ``host_ids`` that have not beaten for ``seconds`` or more (by the database's
    clock), stopped ones and ids with no row at all included: hosts whose containers
    nobody will tend any more."""
    if not host_ids:
        return set()
    with db.read() as session:
        rows = session.execute(
            select(HostRow.host_id, HostRow.state, _age_s(db, HostRow.heartbeat_at)).where(
                HostRow.host_id.in_(sorted(host_ids))
            )
        ).all()
    beating = {
        host_id
        for host_id, state, age in rows
        if checked(STATES, state, "hosts.state") != "stopped" and float(age) < seconds
    }
    return host_ids - beating


def machine_of(db: Database, host_id: str) -> str | None:
    """The machine ``host_id`` last registered from (``core/machine.py``; None: unknown)."""
    with db.read() as session:
        return session.scalar(select(HostRow.machine).where(HostRow.host_id == host_id))


def get_host(db: Database, host_id: str, *, window_s: float = ALIVE_WINDOW_S) -> Host | None:
    return next((h for h in list_hosts(db, window_s=window_s) if h.host_id == host_id), None)


# -- the heartbeat thread ------------------------------------------------------------


class HostHeartbeat:
    """Registers this process as ``host_id`` and beats its row until stopped.

    One per worker, in its main process (``workers/tasks.py`` starts it when
    the worker is ready and stops it on shutdown).  ``warm_count`` (made by
    the composition root) counts the host's running warm containers; it runs
    on a thread of its own every interval and each beat reports its latest
    count, so a slow Docker engine never delays a beat.  A failed beat (the
    database away) is logged and tried again at the next one.
    """

    def __init__(
        self,
        db: Database,
        *,
        host_id: str,
        version: str,
        concurrency: int,
        warm_count: Callable[[], int | None] | None = None,
        interval_s: float = HEARTBEAT_INTERVAL_S,
        window_s: float = ALIVE_WINDOW_S,
        machine: str = "",
        on_cut_off: Callable[[float], object] | None = None,
    ) -> None:
        self.db, self.host_id, self.version, self.concurrency = db, host_id, version, concurrency
        self.machine = machine
        # Told each beat that reached the database; runs ``on_cut_off`` when none has for a while.
        self._fence = SelfFence(on_cut_off, name=f"host-fence-{host_id}") if on_cut_off is not None else None
        self.instance = f"{os.getpid()}:{uuid.uuid4().hex[:8]}"
        self.interval_s, self.window_s = interval_s, window_s
        self._warm_count = warm_count
        self._warm: int | None = None
        self._draining = False
        self._stopping = False
        self._stopped = False
        self._taken_over = False
        self._wake = threading.Event()
        self._thread = threading.Thread(target=self._run, name=f"host-heartbeat-{host_id}", daemon=True)
        self._counter = threading.Thread(target=self._count, name=f"host-warm-count-{host_id}", daemon=True)
        self._stop_counting = threading.Event()

    def start(self) -> HostHeartbeat:
        try:
            self._register()
        except Exception:  # the thread registers at its next beat
            log.warning("could not register host %s; trying again at the next beat", self.host_id, exc_info=True)
        self._thread.start()
        if self._warm_count is not None:
            self._counter.start()
        if self._fence is not None:
            self._fence.start()
        return self

    def drain(self) -> None:
        """A warm shutdown began: say ``draining`` at once (safe from a signal handler: sets flags only)."""
        self._draining = True
        self._wake.set()

    def stop(self, timeout: float = 10.0) -> None:
        """Stop beating and mark the row ``stopped`` (once)."""
        if self._stopped:
            return
        self._stopped = self._stopping = True
        self._wake.set()
        self._stop_counting.set()
        if self._fence is not None:
            self._fence.stop()
        if self._thread.is_alive():
            self._thread.join(timeout)
        try:
            mark_stopped(self.db, self.host_id, self.instance)
        except Exception:  # the row then dies by its age
            log.warning("could not mark host %s stopped", self.host_id, exc_info=True)

    def beat(self) -> None:
        """One heartbeat now (what the thread does every interval)."""
        if heartbeat(self.db, self.host_id, self.instance, warm_containers=self._warm, draining=self._draining):
            self._taken_over = False
        else:
            current = get_host(self.db, self.host_id, window_s=self.window_s)
            if (
                current is None
                or current.instance == self.instance
                or not current.alive
                or (
                    # Its holder was a process of this machine that is gone (SIGKILLed): take the row
                    # back now, before it looks dead and takes this process's leases with it.
                    current.hostname == socket.gethostname() and not pid_running(current.pid)
                )
            ):
                self._register()
            elif not self._taken_over:
                self._taken_over = True
                log.error(
                    "host id %r is held by another live process (pid %s on %s); not beating it until that "
                    "one stops: give each worker host its own ORCHESTRATOR_HOST_ID",
                    self.host_id,
                    current.pid,
                    current.hostname,
                )

    def _register(self) -> None:
        register(
            self.db,
            host_id=self.host_id,
            instance=self.instance,
            version=self.version,
            concurrency=self.concurrency,
            warm_containers=self._warm,
            window_s=self.window_s,
            machine=self.machine,
        )
        if self._draining:
            heartbeat(self.db, self.host_id, self.instance, warm_containers=self._warm, draining=True)

    def _count(self) -> None:
        assert self._warm_count is not None
        while True:
            try:
                self._warm = self._warm_count()
            except Exception:  # reported as unknown
                log.debug("could not count warm containers", exc_info=True)
                self._warm = None
            if self._stop_counting.wait(self.interval_s):
                return

    def _run(self) -> None:
        next_beat = time.monotonic() + self.interval_s
        while True:
            self._wake.wait(max(0.0, next_beat - time.monotonic()))
            self._wake.clear()
            if self._stopping:
                return
            next_beat = time.monotonic() + self.interval_s
            try:
                self.beat()
                if self._fence is not None:
                    self._fence.beat_ok()
            except Exception:  # the database away: try again next beat
                log.warning(
                    "heartbeat of host %s failed; trying again in %.0fs", self.host_id, self.interval_s, exc_info=True
                )
