"""Whether a worker process still runs, told from any host in a moment (issue 37).

A lease holder that is SIGKILLed stops renewing, but another host could only tell from its
host's heartbeat stopping (``hosts.ALIVE_WINDOW_S``, 9 s).  So every process that takes
leases keeps a **liveness token** others can test (``process_liveness``, one row per host
id and pid, written when the process first takes a lease, :func:`ensure`):

* PostgreSQL: a session of its own, kept open and idle (``pg:<backend pid>:<backend
  start>``).  The kernel closes a dead process's sockets, and the server ends the session
  at once; it is then gone from ``pg_stat_activity``.  A thread blocks on the session and
  makes it again when it fails (a server restart, ``pg_terminate_backend``), writing the
  new token.
* SQLite (one machine): a file under the database's folder the process holds an ``flock``
  on (``flock:<name>``); the kernel lets go of it when the process dies, and a tester's
  non-blocking ``flock`` then succeeds.  A file that is not there is no verdict.

:func:`gone` tests tokens.  A gone token is not enough on its own: a process whose session
was ended by the server is alive and makes a new one.  So the fast rule
(``store/leases.py``: :data:`~orchestrator.store.leases.TAKE_OVER_AFTER_S`) takes a lease
early only when its holder's token is gone **and** the holder has not renewed it for a
while (``groups.lease_renewed_at``), and never in the moments after the PostgreSQL server
started (every session is new then, every old token gone; :data:`SERVER_SETTLE_S`).
Everything else waits for the host's heartbeat window or the lease's expiry, as before.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import logging
import os
import threading
import weakref
from collections.abc import Iterable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from sqlalchemy import select, text
from sqlalchemy.dialects.postgresql import insert as pg_insert
from sqlalchemy.dialects.sqlite import insert as sqlite_insert

from orchestrator.store.db import Database
from orchestrator.store.tables import ProcessLivenessRow

log = logging.getLogger(__name__)

FOLDER = "liveness"
# After the PostgreSQL server (re)started, every session is new and every earlier token
# gone: the fast rule waits this long, so that live holders have made theirs again.
SERVER_SETTLE_S = 15.0
# How long the keeper waits before making a failed session again (then it doubles, to 5 s).
RETRY_S = 0.2


@dataclass
class _Keeper:
    """This process's token for one database: the session (PostgreSQL) or the locked file (SQLite).

    It holds its database weakly and is closed when the database is disposed or collected,
    so a handle a caller forgot does not keep a session open for ever."""

    db_ref: weakref.ref[Database]
    host_id: str
    is_sqlite: bool
    pid: int = field(default_factory=os.getpid)
    token: str | None = None
    _fd: int | None = None
    _conn: Any = None
    _stop: threading.Event = field(default_factory=threading.Event)
    _thread: threading.Thread | None = None

    def start(self, db: Database) -> None:
        weakref.finalize(db, self.close)
        if self.is_sqlite:
            self._hold_file(db)
        else:
            self._open_session(db)
            self._thread = threading.Thread(target=self._keep, name="liveness", daemon=True)
            self._thread.start()

    # -- SQLite --------------------------------------------------------------------

    def _hold_file(self, db: Database) -> None:
        folder = liveness_folder(db)
        if folder is None:
            return  # a database in memory: one process, nothing to tell
        folder.mkdir(mode=0o700, parents=True, exist_ok=True)
        name = _file_name(self.host_id, self.pid)
        fd = os.open(folder / name, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC | os.O_NOFOLLOW, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)  # ours: nobody else takes it while we run
            self._fd = fd
        except BlockingIOError:
            # Held: by this process already (another handle on the same database), as no
            # other live process has this pid on this machine.
            os.close(fd)
        self._register(db, f"flock:{name}")

    # -- PostgreSQL ----------------------------------------------------------------

    def _open_session(self, db: Database) -> None:
        import psycopg

        conninfo = db.engine.url.set(drivername="postgresql").render_as_string(hide_password=False)
        conn = psycopg.connect(conninfo, autocommit=True, application_name="orchestrator-liveness")
        row = conn.execute("SELECT pg_backend_pid(), backend_start FROM pg_stat_activity WHERE pid = pg_backend_pid()")
        pid, started = row.fetchone() or (None, None)
        # A channel nobody notifies: the keeper blocks on the session and hears it fail.
        conn.execute("LISTEN orchestrator_liveness")
        self._conn = conn
        self._register(db, f"pg:{pid}:{started.timestamp():.6f}")

    def _keep(self) -> None:
        import psycopg

        wait = RETRY_S
        while not self._stop.is_set():
            try:
                if self._conn is None:
                    db = self.db_ref()
                    if db is None:
                        return
                    self._open_session(db)
                    del db
                    wait = RETRY_S
                for _ in self._conn.notifies(timeout=30.0):
                    pass  # nothing is sent on the channel; a failed session raises here
                if self._stop.is_set():
                    return
                self._conn.execute("SELECT 1")  # an idle session's keepalive
            except (psycopg.Error, OSError) as exc:
                if self._stop.is_set():
                    return
                with contextlib.suppress(Exception):
                    if self._conn is not None:
                        self._conn.close()
                self._conn = None
                if isinstance(exc, psycopg.errors.InvalidCatalogName):
                    return  # the database is gone (dropped): nothing to keep a token in
                log.warning("the liveness session failed (%s): making it again in %.1fs", exc, wait)
                self._stop.wait(wait)
                wait = min(wait * 2, 5.0)

    def _register(self, db: Database, token: str) -> None:
        self.token = token
        row = {"host_id": self.host_id, "pid": self.pid, "token": token, "registered_at": datetime.now(UTC)}
        insert = sqlite_insert if db.is_sqlite else pg_insert
        upsert = insert(ProcessLivenessRow).values(**row)
        upsert = upsert.on_conflict_do_update(
            index_elements=["host_id", "pid"], set_={"token": token, "registered_at": row["registered_at"]}
        )
        with db.write() as session:
            session.execute(upsert)

    def close(self) -> None:
        self._stop.set()
        if self._conn is not None:
            with contextlib.suppress(Exception):
                self._conn.close()
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None


_lock = threading.Lock()


def ensure(db: Database, host_id: str) -> str | None:
    """Keep this process's liveness token for ``db`` (made at the first call in a process,
    kept on ``db``; later calls look at an attribute); the token (None: none could be
    made, logged)."""
    keeper = db.liveness_keeper
    if isinstance(keeper, _Keeper) and keeper.pid == os.getpid() and keeper.host_id == host_id:
        return keeper.token
    with _lock:
        keeper = db.liveness_keeper
        if not isinstance(keeper, _Keeper) or keeper.pid != os.getpid() or keeper.host_id != host_id:
            if isinstance(keeper, _Keeper) and keeper.pid == os.getpid():
                keeper.close()  # this process under another host id (tests): one token at a time
            keeper = _Keeper(weakref.ref(db), host_id, db.is_sqlite)
            try:
                keeper.start(db)
            except Exception as exc:  # noqa: BLE001 - without a token the slower rules still hold
                log.warning("no liveness token for this process (%s): its leases wait out the usual window", exc)
            db.liveness_keeper = keeper
        return keeper.token


def forget(db: Database) -> None:
    """Let go of this process's token for ``db`` (a process that ends lets go anyway)."""
    with _lock:
        keeper, db.liveness_keeper = db.liveness_keeper, None
    if isinstance(keeper, _Keeper) and keeper.pid == os.getpid():
        keeper.close()


def liveness_folder(db: Database) -> Path | None:
    path = db.engine.url.database if db.is_sqlite else None
    if not path or path == ":memory:":
        return None
    return Path(path).resolve().parent / FOLDER


def _file_name(host_id: str, pid: int) -> str:
    return hashlib.sha256(f"{host_id}:{pid}".encode()).hexdigest()[:32]


def tokens_of(db: Database, processes: Iterable[tuple[str, int]]) -> dict[tuple[str, int], str]:
    """The registered tokens of ``processes`` ((host id, pid) pairs) that have one."""
    wanted = set(processes)
    if not wanted:
        return {}
    hosts = {h for h, _ in wanted}
    with db.read() as session:
        rows = session.execute(
            select(ProcessLivenessRow.host_id, ProcessLivenessRow.pid, ProcessLivenessRow.token).where(
                ProcessLivenessRow.host_id.in_(hosts)
            )
        ).all()
    return {(h, p): t for h, p, t in rows if (h, p) in wanted}


def gone(db: Database, tokens: Iterable[str]) -> set[str]:
    """Which of ``tokens`` name a process that is gone now (a token this database cannot
    test, or a file that is not there, is not gone: no verdict)."""
    tokens = set(tokens)
    if db.is_sqlite:
        folder = liveness_folder(db)
        return {t for t in tokens if folder is not None and _file_released(folder, t)}
    sessions = {}
    for t in tokens:
        parts = t.split(":", 2)
        if len(parts) == 3 and parts[0] == "pg" and parts[1].isdigit():
            sessions[t] = (int(parts[1]), parts[2])
    if not sessions:
        return set()
    with db.read() as session:
        rows = session.execute(_SESSIONS, {"pids": [pid for pid, _ in sessions.values()]}).all()
    alive = {(int(pid), f"{started.timestamp():.6f}") for pid, started in rows}
    return {t for t, key in sessions.items() if key not in alive}


_SESSIONS = text("SELECT pid, backend_start FROM pg_stat_activity WHERE pid = ANY(:pids)")
_UPTIME = text("SELECT EXTRACT(EPOCH FROM now() - pg_postmaster_start_time())")


def _file_released(folder: Path, token: str) -> bool:
    if not token.startswith("flock:"):
        return False
    name = token.removeprefix("flock:")
    if "/" in name or not name:
        return False
    try:
        fd = os.open(folder / name, os.O_RDWR | os.O_CLOEXEC | os.O_NOFOLLOW)
    except OSError:
        return False  # not there: no verdict
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        return False  # held: its process runs
    else:
        fcntl.flock(fd, fcntl.LOCK_UN)
        return True
    finally:
        os.close(fd)


def server_settled(db: Database) -> bool:
    """Whether the PostgreSQL server has run :data:`SERVER_SETTLE_S` since it started (SQLite: yes)."""
    if db.is_sqlite:
        return True
    with db.read() as session:
        up = session.execute(_UPTIME).scalar()
    return up is not None and float(up) >= SERVER_SETTLE_S
