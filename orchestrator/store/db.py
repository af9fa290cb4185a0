"""Database access: an engine, sessions, and automatic migrations.

SQLite (the embedded default) is tuned for several processes writing at once:
WAL so readers never block the writer, a long busy timeout, and write
transactions that start with ``BEGIN IMMEDIATE`` so two writers queue on the
lock instead of failing when a read transaction tries to upgrade.

The API waits less for the write lock than workers do (:meth:`Database.limit_wait`):
a request that cannot write within ``ORCHESTRATOR_API_DB_WAIT_S`` answers 503.
:func:`unavailable_reason` tells such passing states (a lock held elsewhere, a
server restarting, a full disk) from bugs, so the API answers them 503 with
``Retry-After`` rather than 500.

PostgreSQL (the fleet setup) runs on psycopg 3 at READ COMMITTED; migrations
and seq assignment are serialized with advisory locks.  Engines are fork-safe:
a pooled connection is never used or closed by a process other than the one
that opened it (Celery's prefork children inherit the parent's pool).

Opening a database that is already at the newest schema reads one row
(``alembic_version``) and never imports Alembic: every CLI command opens the
database, and ``orchestrator send`` must start at once.
"""

from __future__ import annotations

import contextlib
import fcntl
import functools
import os
import re
import sqlite3
import time
from collections.abc import Callable, Iterator, Mapping
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any

from sqlalchemy import (
    ColumnElement,
    CursorResult,
    Engine,
    Float,
    Result,
    cast,
    create_engine,
    event,
    exc,
    extract,
    func,
    select,
    text,
    type_coerce,
)

# Connection and Session are re-exported: the transaction types callers outside the
# store hold and pass back in (a store function runs in its caller's transaction),
# so that no module outside orchestrator/store imports SQLAlchemy.
from sqlalchemy import Connection as Connection
from sqlalchemy.engine import make_url
from sqlalchemy.orm import Session as Session
from sqlalchemy.orm import sessionmaker

from orchestrator.core.errors import ConfigError
from orchestrator.core.settings import Settings
from orchestrator.store.tables import UTCDateTime

if TYPE_CHECKING:
    from sqlalchemy.engine.interfaces import DBAPIConnection
    from sqlalchemy.pool import ConnectionPoolEntry, PoolProxiedConnection

_MIGRATIONS = Path(__file__).parent / "migrations"
# The newest revision in migrations/versions; tests/host/test_migrations.py
# holds it to Alembic's own head, so a new revision cannot forget it.
SCHEMA_HEAD = "0028"

# A pooled PostgreSQL connection idle for longer than this is pinged before it is
# used again (``_ping_when_idle``).  A connection used more recently saw the server
# up that long ago; a restart (a stop, a crash and recovery, a failover) takes
# longer, and a connection that met the outage itself was dropped with the rest
# of the pool when its statement failed.
PING_IDLE_S = 0.2


# The SQLite file holds every chat: this user's alone.  SQLite gives the -wal and -shm files
# it makes the database file's mode.
PRIVATE_FILE_MODE = 0o600
_SQLITE_SIDE_FILES = ("", "-wal", "-shm", "-journal")


def private_database_file(path: Path) -> None:
    """Make the SQLite file ``path`` 0600 before SQLite opens it (a new folder for it 0700), and
    take group and other access from it and its -wal, -shm and -journal files if this user's
    (made before, under a looser umask).  An existing folder is left as it is: the data dir's
    own are made private by ``Settings.ensure_dirs``."""
    path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
    os.close(os.open(path, os.O_RDONLY | os.O_CREAT | os.O_CLOEXEC, PRIVATE_FILE_MODE))
    for suffix in _SQLITE_SIDE_FILES:
        try:
            st = os.stat(f"{path}{suffix}")
        except FileNotFoundError:
            continue
        if st.st_mode & 0o077 and st.st_uid == os.geteuid():
            os.chmod(f"{path}{suffix}", PRIVATE_FILE_MODE)


class Database:
    """An engine plus the two kinds of session the code needs."""

    def __init__(self, url: str, *, lock_dir: Path | None = None) -> None:
        self.url = url
        # SQLite's busy timeout: how long a writer waits for another's lock before "database is locked".
        self._busy_ms = 60_000
        parsed = make_url(url)
        self.is_sqlite = parsed.get_backend_name() == "sqlite"
        if self.is_sqlite:
            db_path = parsed.database
            if db_path and db_path != ":memory:":
                private_database_file(Path(db_path))
            self.engine = create_engine(parsed, connect_args={"timeout": 60})
            _tune_sqlite(self.engine, lambda: self._busy_ms)
            # What the driver raises itself (the ingest path's driver_execute bypasses SQLAlchemy).
            self.driver_errors: tuple[type[Exception], ...] = (sqlite3.Error,)
        elif parsed.get_backend_name() in ("postgresql", "postgres"):
            if parsed.drivername in ("postgresql", "postgres"):
                # psycopg 3 is the driver we ship; plain URLs (and the common
                # "postgres://" spelling, which SQLAlchemy no longer accepts) mean it.
                # The URL object goes to create_engine as is: no re-rendering,
                # so passwords with special characters survive.
                parsed = parsed.set(drivername="postgresql+psycopg")
            # LIFO: under load the same few connections stay hot (and unpinged); the rest age.
            self.engine = create_engine(parsed, pool_size=5, max_overflow=5, pool_use_lifo=True)
            import psycopg  # already imported: create_engine loaded the dialect's driver

            self.driver_errors = (psycopg.Error,)
        else:
            raise ConfigError(f"unsupported database URL {parsed.render_as_string()!r}: use sqlite or postgresql")
        # Every exception type that means "the database said no" (SQLAlchemy's and the
        # driver's own): what the API maps to 503 or 500 through unavailable_reason.
        self.error_kinds: tuple[type[Exception], ...] = (exc.DBAPIError, exc.TimeoutError, *self.driver_errors)
        self._pid = os.getpid()
        _fork_safe(self.engine)
        if not self.is_sqlite:
            _ping_when_idle(self.engine, PING_IDLE_S)  # after the fork check: never ping another's socket
        self._lock_dir = lock_dir
        # This process's liveness token (store/liveness.py), made when it first takes a lease.
        self.liveness_keeper: object | None = None
        self._sessions = sessionmaker(self.engine, expire_on_commit=False)
        # Reads: SQLite begins DEFERRED (never its write lock).  PostgreSQL reads in
        # autocommit: at READ COMMITTED every statement takes its own snapshot, in a
        # transaction or not, so a BEGIN and a COMMIT around a read buy nothing but two
        # round trips and a server transaction (about half of a run's transactions are
        # reads: docs/performance.md, "The control plane").  psycopg switches autocommit
        # on the client side, so the switch itself sends nothing.
        read_options = {"sqlite_deferred": True} if self.is_sqlite else {"isolation_level": "AUTOCOMMIT"}
        self._read_sessions = sessionmaker(self.engine.execution_options(**read_options), expire_on_commit=False)

    def ping(self) -> None:
        """A ``SELECT 1`` on the driver, outside a transaction (SQLAlchemy's would begin
        one: on SQLite ``BEGIN IMMEDIATE``, the write lock); raises what the database says."""
        with self.engine.connect() as conn:
            driver_execute(conn, "SELECT 1").fetchone()

    def limit_wait(self, seconds: float) -> None:
        """Wait at most ``seconds`` for SQLite's write lock from now on, in this process (the
        API: a caller is waiting, and hears 503 sooner rather than hang for the workers' 60 s).
        Pooled connections take the new timeout at their next checkout.  PostgreSQL: nothing."""
        self._busy_ms = max(1, round(seconds * 1000))

    @contextlib.contextmanager
    def write(self) -> Iterator[Session]:
        """A transaction that commits on success and rolls back on error."""
        with self._sessions() as session, session.begin():
            yield session

    @contextlib.contextmanager
    def read(self) -> Iterator[Session]:
        """A read-only transaction (never takes SQLite's write lock)."""
        with self._read_sessions() as session, session.begin():
            yield session

    def read_fixed(self, sql: str, params: Mapping[str, object] | None = None) -> list[Any]:
        """The rows of one fixed read on the driver (:func:`driver_execute`), outside any
        transaction: on PostgreSQL in autocommit (no BEGIN: at READ COMMITTED the statement
        has its own snapshot either way), on SQLite as its connections always run a lone
        statement (a WAL read, no lock taken).  For the hot paths' reads: about a quarter of
        the CPU of an ORM session's (docs/performance.md, "The control plane")."""
        with self.engine.connect() as conn:
            if not self.is_sqlite:
                conn.execution_options(isolation_level="AUTOCOMMIT")
            rows: list[Any] = driver_execute(conn, sql, params).fetchall()
            return rows

    def write_fixed(self, sql: str, params: Mapping[str, object] | None = None) -> int:
        """One fixed statement on the driver (:func:`driver_execute`) in a transaction of its
        own (SQLite's BEGIN IMMEDIATE, as :meth:`write`); the rows it changed.  For the run
        path's one-statement writes: no ORM session, statement object or cache key."""
        with self.transaction() as conn:
            changed: int = driver_execute(conn, sql, params).rowcount
            return changed

    @contextlib.contextmanager
    def transaction(self) -> Iterator[Connection]:
        """A write transaction for fixed statements on the driver (:func:`driver_execute`):
        commits on success, rolls back on error; SQLite's BEGIN IMMEDIATE, as :meth:`write`.
        For the run path's writes of several statements: no ORM session, unit of work or
        statement object (docs/performance.md, "The control plane")."""
        with self.engine.begin() as conn:
            yield conn

    def now(self) -> datetime:
        """What time the database says it is (aware, UTC): one fixed read, no transaction."""
        found = db_time(self.read_fixed(_NOW[self.is_sqlite])[0][0])
        assert found is not None
        return found

    def schema_revision(self) -> str | None:
        """The schema's Alembic revision (None: no ``alembic_version`` table yet)."""
        try:
            with self.read() as session:
                return session.execute(text("SELECT version_num FROM alembic_version")).scalar()
        except exc.DBAPIError:
            return None

    def migrate(self) -> None:
        """Bring the schema to the newest revision; safe to call from many processes."""
        if self.schema_revision() == SCHEMA_HEAD:
            return
        from alembic import command
        from alembic.config import Config

        with self._migration_lock(), self.engine.begin() as conn:
            if not self.is_sqlite:
                conn.execute(text("SELECT pg_advisory_xact_lock(726931)"))
            cfg = Config()
            cfg.set_main_option("script_location", str(_MIGRATIONS))
            cfg.attributes["connection"] = conn
            command.upgrade(cfg, "head")

    @contextlib.contextmanager
    def _migration_lock(self) -> Iterator[None]:
        # SQLite has no advisory locks; a file lock beside the data serializes
        # first-time schema creation between processes starting together.
        if not (self.is_sqlite and self._lock_dir):
            yield
            return
        self._lock_dir.mkdir(parents=True, exist_ok=True)
        with open(self._lock_dir / ".migrate.lock", "w") as fh:
            fcntl.flock(fh, fcntl.LOCK_EX)
            try:
                yield
            finally:
                fcntl.flock(fh, fcntl.LOCK_UN)

    def dispose(self) -> None:
        # In a forked child the pooled connections are the parent's: closing
        # them would end the parent's sessions too (PostgreSQL gets a
        # Terminate on the shared socket), so just forget them.
        self.engine.dispose(close=os.getpid() == self._pid)
        keeper, self.liveness_keeper = self.liveness_keeper, None
        if keeper is not None and getattr(keeper, "pid", None) == os.getpid():
            keeper.close()  # type: ignore[attr-defined]  # store/liveness.py's, which imports this module


# -- the database's clock ---------------------------------------------------------
#
# Times that more than one process compares (lease expiries, delivery claim
# deadlines, heartbeats) are written and compared on the database's clock,
# never a host's: hosts whose clocks disagree are then judged alike.


def now_sql(db: Database | Session) -> ColumnElement[datetime]:
    """The database's current time, as an expression the database evaluates
    (SQLite: UTC text with milliseconds; PostgreSQL: ``now()``, the transaction's start)."""
    if _is_sqlite(db):
        # CURRENT_TIMESTAMP has whole seconds only; same UTC text, with milliseconds.
        return type_coerce(func.strftime("%Y-%m-%d %H:%M:%f", "now"), UTCDateTime())
    return type_coerce(func.now(), UTCDateTime())


def age_sql(db: Database | Session, column: Any) -> ColumnElement[float]:
    """Seconds from ``column`` to the database's now, computed by the database."""
    if _is_sqlite(db):
        return cast((func.julianday("now") - func.julianday(column)) * 86400.0, Float)
    return cast(extract("epoch", func.now() - column), Float)


def db_now(session: Session | Connection) -> datetime:
    """What time the database says it is (aware, UTC), read in the caller's transaction:
    compute a deadline from it and write it in the same transaction.  On a Core
    connection (the run path's fixed transactions), as fixed SQL on the driver."""
    if isinstance(session, Connection):
        sqlite = session.dialect.name == "sqlite"
        found = db_time(driver_execute(session, _NOW[sqlite]).fetchone()[0])
        assert found is not None
        return found
    return session.execute(select(now_sql(session))).scalar_one()


# The same clock in fixed SQL (driver_execute's statements), per backend.  SQLite's text
# has SQLAlchemy's own six-digit fraction, so it compares and sorts with the values the
# ORM writes (strftime's %f gives milliseconds).


def now_text(*, sqlite: bool) -> str:
    """SQL: the database's now, as :func:`now_sql` evaluates it."""
    return "(strftime('%Y-%m-%d %H:%M:%f', 'now') || '000')" if sqlite else "now()"


def later_text(seconds_param: str, *, sqlite: bool) -> str:
    """SQL: the database's now plus the parameter ``seconds_param`` (a number of seconds)."""
    if sqlite:
        return f"(strftime('%Y-%m-%d %H:%M:%f', 'now', '+' || :{seconds_param} || ' seconds') || '000')"
    return f"(now() + :{seconds_param} * interval '1 second')"


def age_text(column: str, *, sqlite: bool) -> str:
    """SQL: seconds from ``column`` to the database's now, as :func:`age_sql`."""
    if sqlite:
        return f"((julianday('now') - julianday({column})) * 86400.0)"
    return f"extract(epoch FROM now() - {column})"


def db_time(value: datetime | str | None) -> datetime | None:
    """A time column's value as the driver gives it (SQLite: UTC text; PostgreSQL: an
    aware datetime), aware in UTC, as :class:`~orchestrator.store.tables.UTCDateTime` reads it."""
    if value is None:
        return None
    if isinstance(value, str):
        value = datetime.fromisoformat(value)
    return value.replace(tzinfo=UTC) if value.tzinfo is None else value.astimezone(UTC)


_NOW = {sqlite: f"SELECT {now_text(sqlite=sqlite)}" for sqlite in (True, False)}

_NAMED = re.compile(r"(?<!:):([a-z_][a-z0-9_]*)")  # :name, never a cast (::text)


def driver_execute(conn: Connection, sql: str, params: Mapping[str, object] | None = None) -> Any:
    """Run ``sql`` (written with ``:name`` parameters) on the DBAPI connection
    under ``conn``, inside its transaction; returns the DBAPI cursor.  ``params``
    binds those names (each statement its own; the driver takes any value).

    For the hot paths' fixed statements (ingest, the run path's, through
    :meth:`Database.read_fixed` and :meth:`Database.write_fixed`): no statement
    object, cache key, compile or result wrapper per call, about a quarter of
    the cost of ``Connection.execute`` (docs/performance.md).  Errors are the
    driver's own exceptions; the caller's ``with`` block still rolls back.
    """
    native = sql if conn.dialect.name == "sqlite" else _pyformat(sql)
    # A checked-out connection always has its driver's connection (typed Optional).
    return conn.connection.driver_connection.execute(native, params or {})  # type: ignore[union-attr]


@functools.cache
def _pyformat(sql: str) -> str:
    # A literal % (a LIKE pattern) is %% in psycopg's format.
    return _NAMED.sub(r"%(\1)s", sql.replace("%", "%%"))


def _is_sqlite(db: Database | Session) -> bool:
    if isinstance(db, Database):
        return db.is_sqlite
    return db.get_bind().dialect.name == "sqlite"


def changed_rows(result: Result[Any]) -> int:
    """The rows an UPDATE or DELETE matched.

    ``Session.execute`` is typed to return a ``Result``; for these statements
    it is a ``CursorResult``, the one that knows the count.
    """
    assert isinstance(result, CursorResult)
    return result.rowcount


def _fork_safe(engine: Engine) -> None:
    """Never hand a connection opened by another process (before a fork) to this one."""

    @event.listens_for(engine, "connect")
    def _remember_pid(_dbapi_conn: DBAPIConnection, record: ConnectionPoolEntry) -> None:
        record.info["pid"] = os.getpid()

    @event.listens_for(engine, "checkout")
    def _check_pid(_dbapi_conn: DBAPIConnection, record: ConnectionPoolEntry, proxy: PoolProxiedConnection) -> None:
        if record.info.get("pid") != os.getpid():
            # Detach without closing (the socket belongs to the parent); the
            # pool then opens a fresh connection for this process.
            # Settable on the pool's record and fairy, read-only on the public types they are given as.
            record.dbapi_connection = proxy.dbapi_connection = None  # type: ignore[misc]
            raise exc.DisconnectionError("connection was opened by another process (fork)")


def _ping_when_idle(engine: Engine, idle_s: float) -> None:
    """Ping a pooled connection before use only if it sat idle longer than ``idle_s``.

    SQLAlchemy's ``pool_pre_ping`` pings at every checkout: on PostgreSQL a round trip
    and a server transaction per transaction, 19 of a run's ~87 round trips
    (docs/performance.md, "The control plane").  A connection in steady use needs
    none; one that sat out a server restart has been idle longer than the restart
    took, and is pinged.  A failed ping discards the connection and the pool opens
    a new one (whose failure is the outage, answered 503 by the API)."""

    @event.listens_for(engine, "checkin")
    def _idle_from(_dbapi_conn: DBAPIConnection, record: ConnectionPoolEntry) -> None:
        record.info["idle_since"] = time.monotonic()

    @event.listens_for(engine, "checkout")
    def _ping(dbapi_conn: DBAPIConnection, record: ConnectionPoolEntry, _proxy: PoolProxiedConnection) -> None:
        since = record.info.get("idle_since")
        if since is None or time.monotonic() - since < idle_s:
            return  # just opened, or in use a moment ago
        try:
            engine.dialect.do_ping(dbapi_conn)
        except Exception as error:  # any failure: the pool tries a fresh connection
            raise exc.DisconnectionError(f"a pooled connection failed its ping ({type(error).__name__})") from error


def _tune_sqlite(engine: Engine, busy_ms: Callable[[], int]) -> None:
    @event.listens_for(engine, "connect")
    def _on_connect(dbapi_conn: sqlite3.Connection, record: ConnectionPoolEntry) -> None:
        # Let SQLAlchemy's "begin" event issue BEGIN itself (pysqlite's own
        # transaction handling would otherwise begin lazily and DEFERRED).
        dbapi_conn.isolation_level = None
        cur = dbapi_conn.cursor()
        cur.execute("PRAGMA journal_mode=WAL")
        cur.execute("PRAGMA synchronous=NORMAL")
        record.info["busy_ms"] = busy_ms()
        cur.execute(f"PRAGMA busy_timeout={record.info['busy_ms']:d}")
        cur.execute("PRAGMA foreign_keys=ON")
        cur.close()

    @event.listens_for(engine, "checkout")
    def _on_checkout(
        dbapi_conn: sqlite3.Connection, record: ConnectionPoolEntry, _proxy: PoolProxiedConnection
    ) -> None:
        # A connection pooled before Database.limit_wait changed the wait: one PRAGMA, once.
        if record.info.get("busy_ms") != (wanted := busy_ms()):
            dbapi_conn.execute(f"PRAGMA busy_timeout={wanted:d}")
            record.info["busy_ms"] = wanted

    @event.listens_for(engine, "begin")
    def _on_begin(conn: Connection) -> None:
        deferred = conn.get_execution_options().get("sqlite_deferred", False)
        conn.exec_driver_sql("BEGIN" if deferred else "BEGIN IMMEDIATE")


# What SQLite says when the state is passing: another writer holds the lock past the busy
# timeout; the disk is full or failing (the transaction was rolled back, nothing half-written).
_SQLITE_PASSING = (
    ("locked", "the database is locked by another writer"),
    ("busy", "the database is locked by another writer"),
    ("full", "the database's disk is full"),
    ("disk i/o", "the database's disk could not be read or written"),
)


def unavailable_reason(error: BaseException) -> str | None:
    """Why the database cannot serve now, if ``error`` says the state is passing (for
    people, with no address or name of the database in it), else None: a bug, not an outage.

    Passing: SQLite's lock held by another past the busy timeout, its disk full or failing;
    PostgreSQL unreachable, restarting, shutting down, a connection lost mid-query (every
    OperationalError: what the server or the network did, not what the query asked);
    every pooled connection in use past the pool's timeout."""
    if isinstance(error, exc.TimeoutError):
        return "every database connection is in use"
    # SQLAlchemy's wrapper, or the driver's own error (Database.driver_errors: driver_execute's).
    driver_error = error.orig if isinstance(error, exc.DBAPIError) else error
    if isinstance(driver_error, sqlite3.Error):
        message = str(driver_error).lower()
        # "no such table" and the like are OperationalErrors too, and bugs: only the known words pass.
        return next((reason for word, reason in _SQLITE_PASSING if word in message), None)
    if isinstance(error, exc.DBAPIError) and error.connection_invalidated:
        return "the connection to the database was lost"
    if isinstance(error, (exc.OperationalError, exc.InterfaceError)) or _psycopg_passing(driver_error):
        return "the database does not answer (restarting, or unreachable)"
    return None


def driver_message(error: BaseException) -> str:
    """The driver's words for ``error``, not SQLAlchemy's text (which quotes the
    statement's parameters): what a log line may carry."""
    cause = error.orig if isinstance(error, exc.DBAPIError) else error
    return str(cause).strip()


def _psycopg_passing(error: BaseException | None) -> bool:
    if not type(error).__module__.startswith("psycopg"):
        return False  # psycopg is not imported on SQLite installations: do not import it for this
    import psycopg

    return isinstance(error, (psycopg.OperationalError, psycopg.InterfaceError))


def open_database(settings: Settings, *, migrate: bool = True) -> Database:
    """A Database for ``settings``, migrated to the newest schema unless told not to.

    One per process, made by the composition root (``orchestrator/root.py``);
    nothing here keeps it.
    """
    db = Database(settings.effective_database_url, lock_dir=settings.data_dir)
    if migrate:
        db.migrate()
    return db
