"""Shared fixtures.

Services (Docker engine, Redis, PostgreSQL) are real.  When one is missing, a
test that needs it fails under ``CI=true`` and is skipped (saying why) on a
developer machine without it.

Every test that uses ``db`` runs twice: ``[sqlite]`` (the embedded default, a
file under the test's data dir) and ``[postgresql]`` (a fresh database on
``ORCHESTRATOR_TEST_PG_URL``'s server, dropped afterwards).  The ``settings``
fixture of such a test names the same database.
"""

from __future__ import annotations

import atexit
import contextlib
import functools
import logging
import os
import shutil
import socket
import tempfile
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from orchestrator.core.settings import Settings
from orchestrator.store.db import Database
from tests import durations, file_claims, markers
from tests.web_browser import browser, page  # noqa: F401 - headless Chromium fixtures, one per session

IN_CI = os.environ.get("CI", "").lower() == "true"


def pytest_configure(config: pytest.Config) -> None:
    # Each test file's duration, when scripts/test.sh asks for them (tests/durations.py).
    durations.install(config)


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    # What each test needs, as markers (tests/markers.py), before ``-m`` deselects by them.
    markers.apply(items)
    # Files shared between the pytest processes scripts/test.sh runs at once (tests/file_claims.py).
    file_claims.order(items)


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_protocol(item: pytest.Item, nextitem: pytest.Item | None) -> bool | None:
    """Leave a file another process claimed (True: handled here, nothing run or reported)."""
    if file_claims.claimed(item):
        return None
    # What the last item run here set up and the next one does not need goes now, as a run
    # item's teardown would have done it (the next may be in another folder altogether).
    item.session._setupstate.teardown_exact(nextitem)
    return True


def pytest_terminal_summary(terminalreporter: Any) -> None:
    said = file_claims.summary()
    if said is not None:
        terminalreporter.write_line(said)


@pytest.fixture(autouse=True)
def _logging_as_it_was() -> Iterator[None]:
    """The root logger's handlers and level put back after each test.  A command run in
    the test's process (typer's ``CliRunner``, ``orchestrator.cli.support.setup``) sets up
    logging on the ``sys.stderr`` of that moment, a stream closed when the test ends; a
    line logged later from any thread (a fake server's "listening") would go to it:
    "--- Logging error ---", "I/O operation on closed file"."""
    root = logging.getLogger()
    handlers, level = list(root.handlers), root.level
    yield
    if root.handlers != handlers or root.level != level:
        for handler in root.handlers:
            if handler not in handlers:
                handler.close()
        root.handlers[:] = handlers
        root.setLevel(level)


# Threads of the fake servers (fakes) are named "fake-..." and stopped with their fake.
FAKE_THREAD_PREFIX = "fake-"


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    """Fail the run if a fake server's thread outlived the tests: one left running logs at
    exit, to streams already closed."""
    left = [t for t in threading.enumerate() if t.name.startswith(FAKE_THREAD_PREFIX) and t.is_alive()]
    for thread in left:
        thread.join(timeout=2)
    left = [t.name for t in left if t.is_alive()]
    if left:
        session.config.get_terminal_writer().line(
            f"fake servers' threads still running after the tests: {left}", red=True
        )
        session.exitstatus = pytest.ExitCode.TESTS_FAILED


# Defaults the tests turn off unless they ask for them.  As root the
# default workspace quota loop-mounts a volume per group, and a mounted folder
# outlives the test's temporary data dir (the quota tests ask, and release what
# they mount).  Warm sessions are on by default, and a warm container outlives
# its test by its idle time: tests run cold containers, whose count and
# clean-up they check, unless they ask for warm ones (test_warm.py and the
# sandbox tests parametrized cold/warm do); so are standby sandboxes, which
# a warm test would otherwise start and count among its containers (the
# standby tests ask).  The session folder's quota is a volume too, off unless
# a test asks (test_claude_code_host.py, test_claude_code_sandbox.py).
# Environments built for the processes tests start add TEST_ENV back.
TEST_ENV = {
    "ORCHESTRATOR_WORKSPACE_QUOTA": "0",
    "ORCHESTRATOR_SESSION_QUOTA": "0",
    "ORCHESTRATOR_WARM_IDLE_S": "0",
    "ORCHESTRATOR_STANDBY": "0",
}
os.environ.update({k: v for k, v in TEST_ENV.items() if k not in os.environ})
REDIS_URL = os.environ.get("ORCHESTRATOR_TEST_REDIS_URL", "redis://127.0.0.1:6379/0")
# A role that may CREATE DATABASE; each test gets its own database on this server.
PG_URL = os.environ.get(
    "ORCHESTRATOR_TEST_PG_URL", "postgresql://orchestrator:orchestrator@127.0.0.1:5432/orchestrator"
)
DB_BACKENDS = ["sqlite", "postgresql"]


def require_service(ok: bool, what: str) -> None:
    if ok:
        return
    if IN_CI:
        pytest.fail(f"{what} is required under CI=true but is not available")
    pytest.skip(f"{what} is not available on this developer machine")


def docker_available() -> bool:
    try:
        import docker

        docker.from_env().ping()
        return True
    except Exception:  # noqa: BLE001
        return False


def redis_available(url: str = REDIS_URL) -> bool:
    from urllib.parse import urlparse

    u = urlparse(url)
    try:
        with socket.create_connection((u.hostname or "127.0.0.1", u.port or 6379), timeout=1) as s:
            s.sendall(b"PING\r\n")
            return s.recv(16).startswith(b"+PONG")
    except OSError:
        return False


def _pg_conninfo(url: str) -> str:
    # psycopg wants a libpq URL; accept SQLAlchemy's "postgresql+psycopg://" too.
    from sqlalchemy.engine import make_url

    return make_url(url).set(drivername="postgresql").render_as_string(hide_password=False)


@functools.cache
def pg_available(url: str = PG_URL) -> bool:
    try:
        import psycopg

        with psycopg.connect(_pg_conninfo(url), connect_timeout=3) as conn:
            conn.execute("SELECT 1")
        return True
    except Exception:  # noqa: BLE001
        return False


@contextlib.contextmanager
def fresh_pg_database(url: str = PG_URL, *, migrated: bool = False) -> Iterator[str]:
    """A new database on ``url``'s server (its URL), dropped afterwards; or, with
    ``migrated``, one at the migrations' head with no rows, given back afterwards.

    Migrated databases are recycled within the test process: a CREATE DATABASE
    costs ~0.4 s here and the migrations ~0.25 s more, while emptying the tables
    (``TRUNCATE ... RESTART IDENTITY``) after the test's connections are ended costs
    a few milliseconds.  One whose schema a test changed (a downgrade, an ALTER) is
    dropped instead: the next test gets an exact copy of the migrated template."""
    from sqlalchemy.engine import make_url

    require_service(pg_available(url), f"a PostgreSQL server at {make_url(url).render_as_string()}")
    maintenance = _pg_conninfo(url)
    if migrated:
        template, shape = _migrated_pg_template(url)
        pool = _PG_POOL.setdefault(url, [])
        name = pool.pop() if pool else _create_pg_database(maintenance, template)
        try:
            yield make_url(url).set(database=name).render_as_string(hide_password=False)
        finally:
            if _emptied(maintenance, url, name, shape):
                pool.append(name)
            else:
                _drop_pg_database(maintenance, name)
        return
    name = _create_pg_database(maintenance)
    try:
        yield make_url(url).set(database=name).render_as_string(hide_password=False)
    finally:
        _drop_pg_database(maintenance, name)


# Emptied migrated databases, per server URL, for the next test (see fresh_pg_database).
_PG_POOL: dict[str, list[str]] = {}

# What must match the template for a used database to be recycled: every column
# (type, collation, default, nullability), index and constraint, and the revision.
_SHAPE_SQL = """
SELECT string_agg(x, ' | ' ORDER BY x) FROM (
  SELECT concat_ws(' ', table_name, column_name, data_type, collation_name, column_default, is_nullable) AS x
    FROM information_schema.columns WHERE table_schema = 'public'
  UNION ALL SELECT indexdef FROM pg_indexes WHERE schemaname = 'public'
  UNION ALL SELECT conname || ' ' || pg_get_constraintdef(oid) FROM pg_constraint
    WHERE connamespace = 'public'::regnamespace
  UNION ALL SELECT 'revision ' || version_num FROM alembic_version
) shape
"""


def _create_pg_database(maintenance: str, template: str | None = None) -> str:
    import psycopg
    from psycopg import sql

    name = f"orch_test_{os.getpid()}_{uuid.uuid4().hex[:10]}"
    create = sql.SQL("CREATE DATABASE {}").format(sql.Identifier(name))
    if template is not None:
        create += sql.SQL(" TEMPLATE {}").format(sql.Identifier(template))
    with psycopg.connect(maintenance, autocommit=True) as conn:
        conn.execute(create)
    if template is not None:
        atexit.register(_drop_pg_database, maintenance, name)  # a pooled one outlives its test
    return name


@functools.cache
def _migrated_pg_template(url: str) -> tuple[str, str]:
    """A database migrated to head, the template of the tests' migrated databases
    (dropped at exit), and its shape (``_SHAPE_SQL``).  Nothing stays connected to
    it: PostgreSQL copies a template only while it is unused."""
    from sqlalchemy.engine import make_url

    maintenance = _pg_conninfo(url)
    name = _create_pg_database(maintenance)
    atexit.register(_drop_pg_database, maintenance, name)
    lock_dir = Path(tempfile.mkdtemp(prefix="orch-tmpl-"))
    template = Database(make_url(url).set(database=name).render_as_string(hide_password=False), lock_dir=lock_dir)
    template.migrate()
    template.dispose()
    return name, _shape(url, name)


def _shape(url: str, name: str) -> str:
    import psycopg
    from sqlalchemy.engine import make_url

    with psycopg.connect(
        _pg_conninfo(make_url(url).set(database=name).render_as_string(hide_password=False)), autocommit=True
    ) as conn:
        row = conn.execute(_SHAPE_SQL).fetchone()
    return str(row[0] if row else "")


def _emptied(maintenance: str, url: str, name: str, shape: str) -> bool:
    """End every connection to ``name`` (a test's leftover threads and engines), then
    empty its tables if its shape is still the template's.  False: drop it instead."""
    import psycopg
    from psycopg import sql
    from sqlalchemy.engine import make_url

    try:
        with psycopg.connect(maintenance, autocommit=True) as conn:
            conn.execute(
                "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE datname = %s AND pid <> pg_backend_pid()",
                (name,),
            )
        if _shape(url, name) != shape:
            return False
        target = _pg_conninfo(make_url(url).set(database=name).render_as_string(hide_password=False))
        with psycopg.connect(target, autocommit=True) as conn:
            tables = [
                r[0]
                for r in conn.execute(
                    "SELECT tablename FROM pg_tables WHERE schemaname = 'public' AND tablename <> 'alembic_version'"
                )
            ]
            if tables:
                conn.execute(
                    sql.SQL("TRUNCATE {} RESTART IDENTITY CASCADE").format(
                        sql.SQL(", ").join(sql.Identifier(t) for t in tables)
                    )
                )
        return True
    except psycopg.Error:
        return False


@functools.cache
def _migrated_sqlite_template() -> Path:
    """A SQLite file migrated to head, copied into each test's data dir (see ``db``)."""
    folder = Path(tempfile.mkdtemp(prefix="orch-tmpl-"))
    template = Database(f"sqlite:///{folder / 'template.db'}", lock_dir=folder)
    template.migrate()
    template.dispose()
    return folder / "template.db"


def _drop_pg_database(maintenance: str, name: str) -> None:
    import psycopg
    from psycopg import errors, sql

    force = sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(name))
    plain = sql.SQL("DROP DATABASE IF EXISTS {}").format(sql.Identifier(name))
    with psycopg.connect(maintenance, autocommit=True) as conn:
        try:
            conn.execute(force)
            return
        except errors.InsufficientPrivilege:
            # FORCE needs pg_signal_backend to end an autovacuum worker in the
            # database; a plain DROP stops autovacuum itself (give it a moment).
            pass
        for attempt in range(20):
            try:
                conn.execute(plain)
                return
            except errors.ObjectInUse:
                if attempt == 19:
                    raise
                time.sleep(0.5)


@pytest.fixture(params=DB_BACKENDS)
def db_backend(request: pytest.FixtureRequest) -> str:
    """Which database a test runs on: ``sqlite`` or ``postgresql``."""
    return request.param


@pytest.fixture
def database_url(request: pytest.FixtureRequest, db_backend: str) -> Iterator[str]:
    """The test's database URL ("" = the embedded SQLite default under the data dir)."""
    if db_backend == "sqlite":
        yield ""
        return
    # A test that asks for ``db`` gets it migrated; copying a migrated template is
    # faster than migrating.  Others (the migration tests) get an empty database.
    with fresh_pg_database(migrated="db" in request.fixturenames) as url:
        yield url


@pytest.fixture
def settings(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Settings]:
    # Only tests that use a database are parametrized over the backends; theirs
    # is the database this settings object names.
    url = request.getfixturevalue("database_url") if "db_backend" in request.fixturenames else ""
    # "testserver": the Host name FastAPI's TestClient sends, accepted as this machine's
    # (the API answers only names of this machine while it has no token: orchestrator/http/guards.py).
    yield Settings.load(data_dir=tmp_path / "data", database_url=url, env_file=None, api_allowed_hosts="testserver")


@pytest.fixture
def db(db_backend: str, settings: Settings) -> Iterator[Database]:
    """A migrated database of the test's backend (see ``settings``)."""
    settings.ensure_dirs()
    url = settings.effective_database_url
    if db_backend == "sqlite":
        from sqlalchemy.engine import make_url

        path = Path(make_url(url).database or "")
        if not path.exists():
            shutil.copyfile(_migrated_sqlite_template(), path)
    database = Database(url, lock_dir=settings.data_dir)
    database.migrate()  # a no-op on the migrated copy; proves it is at head
    yield database
    database.dispose()


def alembic(db: Database, action: str, target: str) -> None:
    """Alembic's ``command.<action>`` (upgrade, downgrade) to ``target`` on ``db``: a migration's tests."""
    from alembic import command
    from alembic.config import Config

    from orchestrator.store import db as dbmod

    with db.engine.begin() as conn:
        cfg = Config()
        cfg.set_main_option("script_location", str(dbmod._MIGRATIONS))
        cfg.attributes["connection"] = conn
        getattr(command, action)(cfg, target)


def wait_until(cond: Callable[[], bool], timeout: float, what: str, detail: Callable[[], str] | None = None) -> None:
    """Poll ``cond`` until it holds; fail with ``what`` (and ``detail()``) after ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if cond():
            return
        time.sleep(0.1)
    raise AssertionError(f"timed out after {timeout:.0f}s waiting for {what}\n{detail() if detail else ''}")


def run_in_threads(target: Callable[[int], object], n: int) -> list[BaseException]:
    """Run ``target(i)`` for i in range(n) in parallel threads; returns what they raised."""
    import threading

    errors: list[BaseException] = []

    def guarded(i: int) -> None:
        try:
            target(i)
        except BaseException as exc:  # noqa: BLE001 - reported to the test, not lost in a thread
            errors.append(exc)

    threads = [threading.Thread(target=guarded, args=(i,)) for i in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return errors
