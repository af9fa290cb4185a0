"""The API while its database is away: 503 with ``Retry-After``, never a 500, nothing acknowledged lost.

PostgreSQL: a private cluster of this test (initdb + pg_ctl on a free loopback
port, in a temporary directory), so that stopping it disturbs no other test.
A client posts messages without pause through a real uvicorn server, each until
it is acknowledged (2xx), while the cluster is stopped (a clean ``fast``
shutdown, and an ``immediate`` one: a crash, recovered from the WAL at start)
and started again.  During the outage posts and reads answer 503 with
``Retry-After`` and the error body; after it, the same API process (no restart)
answers 2xx again; every acknowledged message is stored exactly once, including
those whose commit landed while the answer was lost.

A run in progress when PostgreSQL stops (the fake sandbox of
``fakes/sandbox.py``, its agent held until the server is down): the step
fails and leaves its run and lease; once the server is back and the lease has
expired, the sweeper closes the run ("interrupted before any output") and
signals the group, and the next step answers the message, once.

SQLite: another process holds the write lock (``BEGIN IMMEDIATE``, as a worker's
transaction, a backup or a ``sqlite3`` shell would): a post answers 503 after
``ORCHESTRATOR_API_DB_WAIT_S``, reads go on (WAL), and once the lock is released
the same post is stored, once.  Its data dir on a small tmpfs filled up: 503
naming the disk, the database intact (``PRAGMA integrity_check``), and the
refused post stored once when space returns.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import socket
import sqlite3
import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from fastapi.testclient import TestClient
from sqlalchemy import exc, text
from sqlalchemy.engine import make_url

from agent_runner.protocol import AssistantEvent, ResultEvent
from fakes.clock import FakeClock
from fakes.sandbox import FakeSandbox, Script
from orchestrator.core.settings import Settings
from orchestrator.http.api import DB_RETRY_AFTER_S, create_app
from orchestrator.http.endpoint import CLIENT_HEADER
from orchestrator.root import Orchestrator
from orchestrator.run.ingest import IncomingMessage, ingest
from orchestrator.run.outbound import ChannelRegistry
from orchestrator.run.pipeline import Pipeline
from orchestrator.run.sweeper import sweep
from orchestrator.store import db as db_module
from orchestrator.store.db import Database, unavailable_reason
from orchestrator.store.groups import add_group, ensure_main_group
from orchestrator.store.message_log import get_messages_after
from orchestrator.store.runs import list_runs
from tests.conftest import require_service, wait_until
from tests.live_server import serve

JID = "faults@local"
# What this API's clients send with a change while no token is set (orchestrator/http/guards.py).
CLIENT = {CLIENT_HEADER: "tests"}
PG_BIN = Path(os.environ.get("ORCHESTRATOR_TEST_PG_BIN", "/usr/lib/postgresql/15/bin"))


class PrivateCluster:
    """A PostgreSQL cluster of its own on a loopback port: stopped and started at will."""

    def __init__(self, base: Path) -> None:
        self.base = base
        self.data = base / "data"
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            self.port = s.getsockname()[1]
        self.url = f"postgresql://orchestrator@127.0.0.1:{self.port}/orchestrator"

    def _run(self, *args: str) -> None:
        # initdb and the server refuse to run as root: as root, run them as the postgres user.
        prefix = ["runuser", "-u", "postgres", "--"] if os.geteuid() == 0 else []
        subprocess.run([*prefix, *args], check=True, capture_output=True, timeout=60)

    def init(self) -> None:
        self._run(
            str(PG_BIN / "initdb"),
            "-D",
            str(self.data),
            "-U",
            "orchestrator",
            "--auth=trust",
            "-E",
            "UTF8",
            "--no-sync",
        )
        self.start()
        self._run(
            str(PG_BIN / "createdb"), "-h", "127.0.0.1", "-p", str(self.port), "-U", "orchestrator", "orchestrator"
        )

    def start(self) -> None:
        # fsync off: a test cluster; a stop "immediate" still loses nothing (the OS keeps the pages).
        self._run(
            str(PG_BIN / "pg_ctl"),
            "-D",
            str(self.data),
            "-l",
            str(self.base / "server.log"),
            "-w",
            "-o",
            f"-p {self.port} -k {self.base} -c listen_addresses=127.0.0.1 -c fsync=off",
            "start",
        )

    def stop(self, mode: str) -> None:
        self._run(str(PG_BIN / "pg_ctl"), "-D", str(self.data), "-m", mode, "-w", "stop")


@pytest.fixture(scope="module")
def private_pg() -> Iterator[PrivateCluster]:
    require_service(
        (PG_BIN / "initdb").exists(), f"PostgreSQL's server binaries in {PG_BIN} (ORCHESTRATOR_TEST_PG_BIN)"
    )
    base = Path(tempfile.mkdtemp(prefix="orch-pg-"))
    if os.geteuid() == 0:
        shutil.chown(base, "postgres", "postgres")
    cluster = PrivateCluster(base)
    try:
        cluster.init()
        yield cluster
    finally:
        with contextlib.suppress(subprocess.CalledProcessError, subprocess.TimeoutExpired):
            cluster.stop("immediate")
        shutil.rmtree(base, ignore_errors=True)


def _fresh_database(cluster: PrivateCluster, name: str) -> str:
    admin = Database(cluster.url)
    with admin.engine.connect().execution_options(isolation_level="AUTOCOMMIT") as conn:
        conn.execute(text(f"CREATE DATABASE {name}"))
    admin.dispose()
    return make_url(cluster.url).set(database=name).render_as_string(hide_password=False)


def _message(i: int | str) -> dict[str, object]:
    return {"chat_jid": JID, "id": f"m-{i}", "sender": "u1", "sender_name": "Ann", "content": f"message {i}"}


def _assert_unavailable(r: httpx.Response, reason: str) -> None:
    assert r.status_code == 503, r.text
    assert r.headers["Retry-After"] == str(DB_RETRY_AFTER_S)
    body = r.json()
    assert body["retry_after_s"] == DB_RETRY_AFTER_S and reason in body["detail"], body
    assert "127.0.0.1" not in body["detail"] and "orchestrator@" not in body["detail"]  # no address, no user


@pytest.mark.parametrize("mode", ["fast", "immediate"])
def test_postgresql_restarted_during_ingest(private_pg: PrivateCluster, tmp_path: Path, mode: str) -> None:
    url = _fresh_database(private_pg, f"ingest_{mode}")
    settings = Settings.load(data_dir=tmp_path / "data", database_url=url, env_file=None)
    root = Orchestrator(settings)
    add_group(root.db, chat_jid=JID, name="Faults", folder="faults", requires_trigger=True)

    statuses: Counter[int] = Counter()
    acknowledged: list[str] = []
    stop = threading.Event()
    failures: list[BaseException] = []

    def post_until_acknowledged(http: httpx.Client, i: int) -> None:
        while True:
            r = http.post("/api/messages", json=_message(i))
            statuses[r.status_code] += 1
            if r.status_code < 300:
                acknowledged.append(f"m-{i}")
                return
            assert r.status_code == 503, r.text  # never a 500, nor anything else
            assert r.headers.get("Retry-After"), r.headers
            time.sleep(0.05)  # a client would wait Retry-After; the test keeps the pressure on

    def ingest(http: httpx.Client) -> None:
        try:
            i = 1000
            while not stop.is_set():
                post_until_acknowledged(http, i)
                i += 1
        except BaseException as e:  # noqa: BLE001 - reported by the test thread
            failures.append(e)

    with serve(create_app(root)) as base, httpx.Client(base_url=base, timeout=30, headers=CLIENT) as http:
        for i in range(10):
            post_until_acknowledged(http, i)
        writer = threading.Thread(target=ingest, args=(http,), daemon=True)
        writer.start()
        time.sleep(0.5)
        private_pg.stop(mode)
        try:
            with httpx.Client(base_url=base, timeout=30, headers=CLIENT) as other:
                _assert_unavailable(
                    other.post("/api/messages", json=_message("during")), "the database does not answer"
                )
                _assert_unavailable(other.get(f"/api/chats/{JID}/messages"), "the database")
                _assert_unavailable(other.get("/api/groups"), "the database")
                health = other.get("/health")
                assert health.status_code == 200 and health.json()["status"] == "degraded", health.text
                time.sleep(0.5)
        finally:
            private_pg.start()
        time.sleep(0.5)
        stop.set()
        writer.join(timeout=60)
        assert not writer.is_alive() and not failures, failures
        # The same API process, no restart: the pool let go of the dead connections.
        after = http.post("/api/messages", json=_message("after"))
        assert after.status_code == 201 and after.json()["created"], after.text
        read = http.get(f"/api/chats/{JID}/messages")
        assert read.status_code == 200, read.text
        acknowledged.append("m-after")

    assert statuses[503] > 0, f"the outage never met the ingest: {statuses}"
    assert set(statuses) <= {201, 503}, statuses
    stored = Counter(m.id for m in get_messages_after(JID, 0, db=root.db))
    assert set(acknowledged) <= set(stored), set(acknowledged) - set(stored)
    assert all(n == 1 for n in stored.values()), [m for m, n in stored.items() if n > 1]
    # The 503 "during" was never retried; whether its commit landed or not, nothing else is there.
    assert set(stored) - set(acknowledged) <= {"m-during"}
    root.close()


def test_pooled_connections_idle_through_a_restart_are_not_handed_out_dead(
    private_pg: PrivateCluster,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Nothing used the database while it restarted: no statement met the outage, so no
    error dropped the pool, and its connections are dead sockets.  The first transactions
    after the restart must still succeed (store/db.py pings a connection idle longer than
    ``PING_IDLE_S`` before handing it out), while a connection in steady use is not
    pinged at all (a round trip per transaction saved)."""
    # A wider idle window than the default, so that a stall of a loaded machine in the
    # steady loop below is not taken for idleness; the restart outlasts it all the same.
    idle_s = 2.0
    monkeypatch.setattr(db_module, "PING_IDLE_S", idle_s)
    url = _fresh_database(private_pg, "idle_restart")
    db = Database(url)
    pings: list[bool] = []
    real_ping = db.engine.dialect.do_ping

    def counted_ping(dbapi_conn: object) -> bool:
        pings.append(True)
        return real_ping(dbapi_conn)

    monkeypatch.setattr(db.engine.dialect, "do_ping", counted_ping)
    # Three connections in the pool, each used once, then left idle.
    with db.engine.connect() as a, db.engine.connect() as b, db.engine.connect() as c:
        for conn in (a, b, c):
            conn.execute(text("SELECT 1"))
    for _ in range(20):  # in steady use: handed out again at once, never pinged
        with db.read() as session:
            session.execute(text("SELECT 1"))
    assert pings == []
    private_pg.stop("fast")
    private_pg.start()
    time.sleep(idle_s)  # the connections have been idle at least that long
    for _ in range(5):  # more transactions than pooled connections: each is handed out
        with db.write() as session:
            assert session.execute(text("SELECT 41 + 1")).scalar_one() == 42
    assert pings, "no pooled connection was pinged after the restart"
    db.dispose()


def test_a_run_interrupted_by_a_postgresql_restart_is_answered_after(
    private_pg: PrivateCluster, tmp_path: Path
) -> None:
    url = _fresh_database(private_pg, "run_restart")
    settings = Settings.load(data_dir=tmp_path / "data", database_url=url, env_file=None, lease_ttl_s=2)
    settings.ensure_dirs()
    db = Database(url)
    db.migrate()
    jid = ensure_main_group(db).chat_jid
    server_down = threading.Event()
    # The first agent writes its reply only once the server is down; the next one answers at once.
    held = Script(
        [AssistantEvent(text="lost"), ResultEvent()], before_event=lambda i: server_down.wait(30) if i == 0 else None
    )
    sandbox = FakeSandbox(held, Script([AssistantEvent(text="done"), ResultEvent()]))
    p = Pipeline(settings, db, ChannelRegistry([]), sandbox, clock=FakeClock())
    ingest(db, settings, IncomingMessage(chat_jid=jid, sender="u", content="hello"), signal=None)
    failed: list[BaseException] = []

    def first_step() -> None:
        try:
            p.drain_group(jid)
        except BaseException as e:  # noqa: BLE001 - what a Celery task would raise, looked at below
            failed.append(e)

    worker = threading.Thread(target=first_step, name="drain")
    worker.start()
    try:
        assert sandbox.agent_started.wait(30)
        # The container's id is written just after the agent starts: stop once the run is running.
        wait_until(lambda: list_runs(db, chat_jid=jid)[0].state == "running", 30, "the run to be running")
        private_pg.stop("fast")
    finally:
        server_down.set()
        worker.join(60)
        private_pg.start()
    assert not worker.is_alive()
    assert failed and unavailable_reason(failed[0]) is not None, failed  # the step failed on the database
    [interrupted] = list_runs(db, chat_jid=jid)
    assert interrupted.state == "running"  # left as it was: nothing stored, nothing lost
    # The sweeper (beat, every worker start) closes it once the lease expires, and signals the group.
    signalled: list[str] = []
    deadline = time.monotonic() + 30
    while jid not in signalled and time.monotonic() < deadline:
        sweep(db, signal=signalled.append)
        time.sleep(0.2)
    assert jid in signalled, "the sweeper never signalled the interrupted group"
    [outcome] = p.drain_group(jid)
    assert outcome.run.state == "succeeded", outcome.run.error
    runs = {r.id: r for r in list_runs(db, chat_jid=jid)}
    assert runs[interrupted.id].state == "failed" and "interrupted" in (runs[interrupted.id].error or "")
    replies = [m.content for m in get_messages_after(jid, 0, db=db) if m.sender == "bot"]
    assert replies == ["done"]  # answered once; the reply written while the server was down never stored
    db.dispose()


def test_sqlite_locked_by_another_writer_is_a_bounded_wait_then_503(tmp_path: Path) -> None:
    settings = Settings.load(
        data_dir=tmp_path / "data", env_file=None, api_db_wait_s=1.0, api_allowed_hosts="testserver"
    )
    root = Orchestrator(settings)
    add_group(root.db, chat_jid=JID, name="Faults", folder="faults", requires_trigger=True)
    path = make_url(settings.effective_database_url).database
    hold = (
        "import sqlite3, sys\n"
        f"c = sqlite3.connect({path!r}, isolation_level=None)\n"
        "c.execute('BEGIN IMMEDIATE')\n"
        "print('locked', flush=True)\n"
        "sys.stdin.readline()\n"
        "c.execute('COMMIT')\n"
    )
    holder = subprocess.Popen([sys.executable, "-c", hold], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout is not None and holder.stdin is not None
        assert holder.stdout.readline() == "locked\n"
        with TestClient(create_app(root), headers=CLIENT) as client:
            started = time.monotonic()
            r = client.post("/api/messages", json=_message("locked"))
            waited = time.monotonic() - started
            _assert_unavailable(r, "locked by another writer")  # type: ignore[arg-type]  # TestClient's is httpx's
            assert 0.9 <= waited < 4, f"waited {waited:.1f} s for a 1 s bound"
            # Readers are not blocked by a writer (WAL).
            assert client.get(f"/api/chats/{JID}/messages").status_code == 200
            holder.stdin.write("\n")
            holder.stdin.flush()
            assert holder.wait(timeout=10) == 0
            again = client.post("/api/messages", json=_message("locked"))
            assert again.status_code == 201 and again.json()["created"], again.text
        assert [m.id for m in get_messages_after(JID, 0, db=root.db)] == ["m-locked"]
    finally:
        holder.kill()
        holder.wait()
        root.close()


def test_the_workers_wait_stays_long(tmp_path: Path) -> None:
    """Only the API's wait is bounded: a worker's Database keeps SQLite's 60 s busy timeout."""
    db = Database(f"sqlite:///{tmp_path / 'w.db'}")
    with db.engine.connect() as conn:
        assert conn.exec_driver_sql("PRAGMA busy_timeout").scalar() == 60000
    db.limit_wait(2.5)
    with db.engine.connect() as conn:  # the pooled connection takes the new wait at checkout
        assert conn.exec_driver_sql("PRAGMA busy_timeout").scalar() == 2500
    db.dispose()


def test_a_bug_is_not_an_outage(tmp_path: Path) -> None:
    """A query the database rejects (no such table) is no passing state: no 503 for it."""
    db = Database(f"sqlite:///{tmp_path / 'w.db'}")
    with pytest.raises(exc.OperationalError) as raised, db.engine.connect() as conn:
        conn.exec_driver_sql("SELECT * FROM no_such_table")
    assert unavailable_reason(raised.value) is None
    with pytest.raises(sqlite3.OperationalError) as raw, db.engine.connect() as conn:  # the driver's own, unwrapped
        conn.connection.driver_connection.execute("SELECT * FROM no_such_table")  # type: ignore[union-attr]
    assert unavailable_reason(raw.value) is None
    db.dispose()


@pytest.fixture
def small_disk(tmp_path: Path) -> Iterator[Path]:
    """A 4 MiB tmpfs: a data dir whose disk fills up (root only)."""
    mount = tmp_path / "small"
    mount.mkdir()
    require_service(os.geteuid() == 0 and shutil.which("mount") is not None, "root and mount (for a tmpfs)")
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=4m", "tmpfs", str(mount)], check=True, timeout=30)
    try:
        yield mount
    finally:
        subprocess.run(["umount", "-l", str(mount)], check=False, timeout=30)


def test_sqlite_disk_full_is_a_503_then_works_again(small_disk: Path) -> None:
    settings = Settings.load(data_dir=small_disk / "data", env_file=None, api_allowed_hosts="testserver")
    root = Orchestrator(settings)
    add_group(root.db, chat_jid=JID, name="Faults", folder="faults", requires_trigger=True)
    path = make_url(settings.effective_database_url).database
    assert path is not None
    filler = small_disk / "filler"
    acknowledged: list[str] = []
    with TestClient(create_app(root), headers=CLIENT) as client:
        assert client.post("/api/messages", json=_message("before")).status_code == 201
        acknowledged.append("m-before")
        # Leave the disk almost full, then write until it is.
        with open(filler, "wb") as fh, contextlib.suppress(OSError):
            while True:
                fh.write(b"\0" * 65536)
                fh.flush()
        full, refused = None, {}
        for i in range(200):
            refused = {**_message(f"fill-{i}"), "content": "x" * 20_000}
            r = client.post("/api/messages", json=refused)
            if r.status_code == 503:
                full = r
                break
            assert r.status_code == 201, r.text  # never a 500
            acknowledged.append(f"m-fill-{i}")
        assert full is not None, "the disk never filled"
        _assert_unavailable(full, "disk is full")  # type: ignore[arg-type]  # TestClient's is httpx's
        # Not corrupted: SQLite rolled the failed transaction back.
        check = subprocess.run(
            [
                sys.executable,
                "-c",
                f"import sqlite3; print(sqlite3.connect({path!r}).execute('PRAGMA integrity_check').fetchone()[0])",
            ],
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert check.stdout.strip() == "ok", check.stdout + check.stderr
        # Space comes back: the same API process stores again, the refused message included.
        filler.unlink()
        again = client.post("/api/messages", json=refused)
        assert again.status_code == 201 and again.json()["created"], again.text
        acknowledged.append(str(refused["id"]))
    stored = Counter(m.id for m in get_messages_after(JID, 0, db=root.db))
    assert set(stored) == set(acknowledged) and all(n == 1 for n in stored.values()), stored
    root.close()
