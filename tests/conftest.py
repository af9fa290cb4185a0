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

import contextlib
import functools
import os
import socket
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from orchestrator.core.settings import Settings
from orchestrator.store.db import Database
from tests.web_browser import browser, page  # noqa: F401 - headless Chromium fixtures, one per session

IN_CI = os.environ.get("CI", "").lower() == "true"
# As root the default workspace quota loop-mounts a volume per group, and a
# mounted folder outlives the test's temporary data dir: tests get none unless
# they ask (the quota tests do, and release what they mount).  Environments
# built for the processes tests start add NO_QUOTA back.
NO_QUOTA = {"ORCHESTRATOR_WORKSPACE_QUOTA": "0"}
os.environ.update({k: v for k, v in NO_QUOTA.items() if k not in os.environ})
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
def fresh_pg_database(url: str = PG_URL) -> Iterator[str]:
    """A new, empty database on ``url``'s server (its URL), dropped afterwards."""
    import psycopg
    from psycopg import sql
    from sqlalchemy.engine import make_url

    require_service(pg_available(url), f"a PostgreSQL server at {make_url(url).render_as_string()}")
    name = f"orch_test_{os.getpid()}_{uuid.uuid4().hex[:10]}"
    maintenance = _pg_conninfo(url)
    with psycopg.connect(maintenance, autocommit=True) as conn:
        conn.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(name)))
    try:
        yield make_url(url).set(database=name).render_as_string(hide_password=False)
    finally:
        _drop_pg_database(maintenance, name)


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
def database_url(db_backend: str) -> Iterator[str]:
    """The test's database URL ("" = the embedded SQLite default under the data dir)."""
    if db_backend == "sqlite":
        yield ""
        return
    with fresh_pg_database() as url:
        yield url


@pytest.fixture
def settings(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Settings]:
    # Only tests that use a database are parametrized over the backends; theirs
    # is the database this settings object names.
    url = request.getfixturevalue("database_url") if "db_backend" in request.fixturenames else ""
    yield Settings.load(data_dir=tmp_path / "data", database_url=url, env_file=None)


@pytest.fixture
def db(db_backend: str, settings: Settings) -> Iterator[Database]:
    """A migrated database of the test's backend (see ``settings``)."""
    settings.ensure_dirs()
    database = Database(settings.effective_database_url, lock_dir=settings.data_dir)
    database.migrate()
    yield database
    database.dispose()


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
