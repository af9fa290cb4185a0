"""The fleet's hosts table on both databases: registration, heartbeats and liveness on
the database's clock, what a host holds (runs, leases), the heartbeat thread, the CLI's
constant and the API route.  The worker-process side is ``tests/integration/test_hosts.py``."""

from __future__ import annotations

import json
import socket
import subprocess
import time
from collections.abc import Iterator
from datetime import datetime, timedelta

import pytest
from fastapi.testclient import TestClient
from sqlalchemy import event, update

from fakes.sandbox import FakeSandbox, Script
from orchestrator import __version__
from orchestrator.cli import fleet as cli_fleet
from orchestrator.core.settings import Settings
from orchestrator.http.api import create_app
from orchestrator.root import Orchestrator
from orchestrator.store import hosts, leases
from orchestrator.store.db import Database
from orchestrator.store.groups import add_group
from orchestrator.store.runs import create_run, finish_run
from orchestrator.store.tables import GroupRow, HostRow
from tests.conftest import wait_until


def _register(db: Database, host_id: str = "host-a", instance: str = "1:aa", **kw: object) -> None:
    hosts.register(db, host_id=host_id, instance=instance, version="9.9", concurrency=3, **kw)  # type: ignore[arg-type]


def _host(db: Database, host_id: str = "host-a", **kw: float) -> hosts.Host:
    found = hosts.get_host(db, host_id, **kw)
    assert found is not None, f"{host_id} is not in {[h.host_id for h in hosts.list_hosts(db)]}"
    return found


def _set_heartbeat_back(db: Database, host_id: str, seconds: float) -> None:
    """Make the last beat ``seconds`` old by the database's clock (no sleeping)."""
    then = hosts.database_now(db) - timedelta(seconds=seconds)
    with db.write() as session:
        session.execute(update(HostRow).where(HostRow.host_id == host_id).values(heartbeat_at=then))


def test_a_registered_host_is_listed_alive(db: Database) -> None:
    assert hosts.list_hosts(db) == []
    before = hosts.database_now(db)
    _register(db, warm_containers=2, hostname="machine-1", pid=4242)
    h = _host(db)
    assert (h.state, h.alive, h.hostname, h.pid, h.instance) == ("up", True, "machine-1", 4242, "1:aa")
    assert (h.version, h.concurrency, h.warm_containers, h.stopped_at) == ("9.9", 3, 2, None)
    assert 0 <= h.heartbeat_age_s < 5
    assert before - timedelta(seconds=1) <= h.started_at == h.heartbeat_at <= hosts.database_now(db)
    assert (h.runs, h.groups) == ([], [])


def test_heartbeats_move_the_beat_and_belong_to_the_registering_process(db: Database) -> None:
    _register(db)
    first = _host(db).heartbeat_at
    time.sleep(0.05)
    assert hosts.heartbeat(db, "host-a", "1:aa", warm_containers=5)
    h = _host(db)
    assert h.heartbeat_at > first and h.started_at == first and h.warm_containers == 5
    # Another process's instance, or a host never registered: refused, nothing written.
    assert not hosts.heartbeat(db, "host-a", "2:bb", warm_containers=0)
    assert not hosts.heartbeat(db, "host-z", "1:aa", warm_containers=0)
    assert _host(db).warm_containers == 5 and [x.host_id for x in hosts.list_hosts(db)] == ["host-a"]
    # Draining is said by the heartbeat.
    assert hosts.heartbeat(db, "host-a", "1:aa", warm_containers=None, draining=True)
    assert (_host(db).state, _host(db).alive, _host(db).warm_containers) == ("draining", True, None)


def test_a_host_is_dead_once_its_heartbeat_is_older_than_the_window(db: Database) -> None:
    _register(db)
    _register(db, host_id="host-b", instance="7:bb")
    _set_heartbeat_back(db, "host-a", 20)
    a = _host(db)
    assert not a.alive and a.state == "up" and 19 < a.heartbeat_age_s < 25
    assert _host(db, "host-b").alive  # the other host's beat is fresh
    # Just inside a wider window; and a second short of the default window, still alive.
    assert _host(db, window_s=30).alive
    _set_heartbeat_back(db, "host-a", hosts.ALIVE_WINDOW_S - 1)
    assert _host(db).alive
    # A short window (what the CLI's --window gives) judges a fresh beat dead after that long.
    _set_heartbeat_back(db, "host-a", 0)
    assert _host(db).alive and not _host(db, window_s=0).alive
    # A beat brings it back.
    _set_heartbeat_back(db, "host-a", 60)
    assert hosts.heartbeat(db, "host-a", "1:aa", warm_containers=0)
    assert _host(db).alive and _host(db).heartbeat_age_s < 5


def test_a_stopped_host_is_not_alive_and_beats_no_more(db: Database) -> None:
    _register(db)
    assert not hosts.mark_stopped(db, "host-a", "2:bb")  # not the holder: nothing changes
    assert _host(db).state == "up"
    assert hosts.mark_stopped(db, "host-a", "1:aa")
    h = _host(db)
    assert h.state == "stopped" and not h.alive and h.stopped_at is not None and h.stopped_at >= h.heartbeat_at
    assert not hosts.heartbeat(db, "host-a", "1:aa", warm_containers=0)
    # Registering again (the worker restarted) makes it up and alive, with a new start.
    time.sleep(0.05)
    _register(db, instance="3:cc")
    again = _host(db)
    assert (again.state, again.alive, again.instance, again.stopped_at) == ("up", True, "3:cc", None)
    assert again.started_at > h.started_at


def test_every_time_is_the_databases_own(db: Database) -> None:
    """No statement writing ``hosts`` carries a time from this process: the database stamps them."""
    written: list[tuple[str, object]] = []

    def record(_conn: object, _cursor: object, statement: str, parameters: object, *_: object) -> None:
        if "hosts" in statement and statement.lstrip().upper().startswith(("INSERT", "UPDATE")):
            written.append((statement, parameters))

    event.listen(db.engine, "before_cursor_execute", record)
    try:
        _register(db)
        hosts.heartbeat(db, "host-a", "1:aa", warm_containers=1, draining=True)
        hosts.mark_stopped(db, "host-a", "1:aa")
    finally:
        event.remove(db.engine, "before_cursor_execute", record)
    assert len(written) == 3

    def values(params: object) -> list[object]:
        if isinstance(params, dict):
            return list(params.values())
        assert isinstance(params, (list, tuple))
        return (
            [v for p in params for v in values(p)]
            if params and isinstance(params[0], (dict, list, tuple))
            else list(params)
        )

    clock_sql = "strftime" if db.is_sqlite else "now()"
    for statement, params in written:
        assert not [v for v in values(params) if isinstance(v, datetime | str) and _looks_like_a_time(v)], statement
        assert clock_sql in statement, statement


def _looks_like_a_time(v: object) -> bool:
    if isinstance(v, datetime):
        return True
    try:
        datetime.fromisoformat(str(v))
        return True
    except ValueError:
        return False


def test_runs_and_groups_are_attributed_to_their_host(db: Database) -> None:
    for jid in ("a@x", "b@x", "c@x", "d@x"):
        add_group(db, chat_jid=jid, name=jid, folder=jid.split("@")[0])
    # A host id may hold colons: the owner's last two parts are pid and nonce.
    _register(db, host_id="rack:1")
    _register(db, host_id="host-b", instance="2:bb")
    mine, other = hosts.process_owner("rack:1"), hosts.process_owner("host-b")
    assert hosts.owner_host(mine) == "rack:1" and hosts.owner_host(other) == "host-b"
    assert hosts.owner_host("history:1234") is None and hosts.owner_host(None) is None
    live = create_run(db, chat_jid="a@x", cursor_from=0, cursor_to=1, celery_task_id=None, owner=mine)
    done = create_run(db, chat_jid="b@x", cursor_from=0, cursor_to=1, celery_task_id=None, owner=mine)
    finish_run(db, done.id, state="succeeded")
    theirs = create_run(db, chat_jid="c@x", cursor_from=0, cursor_to=1, celery_task_id=None, owner=other)
    assert leases.acquire(db, "a@x", mine, 60)
    assert leases.acquire(db, "c@x", other, 60)
    # A lease that expired long ago (by the database's clock) is held by nobody.
    assert leases.acquire(db, "d@x", mine, 60)
    with db.write() as session:
        session.execute(
            update(GroupRow)
            .where(GroupRow.chat_jid == "d@x")
            .values(lease_expires_at=hosts.database_now(db) - timedelta(hours=1))
        )
    rack, b = _host(db, "rack:1"), _host(db, "host-b")
    assert [(r.id, r.chat_jid, r.state) for r in rack.runs] == [(live.id, "a@x", "queued")]
    assert rack.groups == ["a@x"]
    assert [r.id for r in b.runs] == [theirs.id] and b.groups == ["c@x"]
    # Placement is listed apart from leases: a group placed on a host whose lease is free.
    assert rack.placed == [] and b.placed == []
    with db.write() as session:
        session.execute(update(GroupRow).where(GroupRow.chat_jid.in_(["b@x", "d@x"])).values(placed_host="rack:1"))
        session.execute(update(GroupRow).where(GroupRow.chat_jid == "c@x").values(placed_host="host-b"))
        session.execute(update(GroupRow).where(GroupRow.chat_jid == "a@x").values(placed_host="gone-host"))
    assert _host(db, "rack:1").placed == ["b@x", "d@x"] and _host(db, "host-b").placed == ["c@x"]
    assert _host(db, "rack:1").groups == ["a@x"]  # the lease, not the placement
    leases.release(db, "a@x", mine)
    finish_run(db, live.id, state="failed", error="x")
    assert (_host(db, "rack:1").runs, _host(db, "rack:1").groups) == ([], [])


def test_the_cli_lists_hosts_with_their_placed_groups(db: Database, settings: Settings) -> None:
    from typer.testing import CliRunner

    from orchestrator.cli.main import app

    add_group(db, chat_jid="p@x", name="p", folder="p")
    _register(db)
    with db.write() as session:
        session.execute(update(GroupRow).where(GroupRow.chat_jid == "p@x").values(placed_host="host-a"))
    env = {
        "ORCHESTRATOR_DATA_DIR": str(settings.data_dir),
        "ORCHESTRATOR_DATABASE_URL": settings.effective_database_url,
    }
    table = CliRunner().invoke(app, ["hosts"], env=env)
    assert table.exit_code == 0, table.output
    header, row = table.output.splitlines()[:2]
    assert header.split() == [
        "HOST",
        "STATE",
        "ALIVE",
        "HEARTBEAT",
        "PID",
        "VERSION",
        "RUNS",
        "WARM",
        "PLACED",
        "GROUPS",
    ]
    assert row.split()[0] == "host-a" and row.split()[-2:] == ["1", "-"]
    listed = CliRunner().invoke(app, ["hosts", "--json"], env=env)
    assert listed.exit_code == 0 and json.loads(listed.output)[0]["placed"] == ["p@x"]


def test_the_pipeline_and_deliverer_own_as_their_host(settings: Settings) -> None:
    def root(s: Settings) -> Orchestrator:
        return Orchestrator(s, sandbox=FakeSandbox(Script()), migrate=False)

    named, unnamed = root(settings.replace(**{"host_id": "host-q"})), root(settings)
    owners = [named.pipeline.owner, named.deliverer().owner, unnamed.pipeline.owner, root(settings).pipeline.owner]
    assert len(set(owners)) == len(owners)  # unique per process and object
    assert [hosts.owner_host(o) for o in owners] == ["host-q", "host-q", *[settings.fleet.effective_host_id] * 2]
    assert settings.fleet.effective_host_id  # the hostname when ORCHESTRATOR_HOST_ID is empty


# -- the heartbeat thread -------------------------------------------------------------


@pytest.fixture
def beats() -> Iterator[list[hosts.HostHeartbeat]]:
    started: list[hosts.HostHeartbeat] = []
    yield started
    for hb in started:
        hb.stop()


def test_the_heartbeat_thread_registers_beats_drains_and_stops(db: Database, beats: list[hosts.HostHeartbeat]) -> None:
    warm = [2]
    hb = hosts.HostHeartbeat(
        db, host_id="host-t", version=__version__, concurrency=4, warm_count=lambda: warm[0], interval_s=0.05
    )
    beats.append(hb.start())
    h = _host(db, "host-t")
    assert (h.state, h.alive, h.instance, h.version, h.concurrency) == ("up", True, hb.instance, __version__, 4)
    wait_until(lambda: _host(db, "host-t").warm_containers == 2, 10, "the warm count in a beat")
    warm[0] = 0
    wait_until(lambda: _host(db, "host-t").warm_containers == 0, 10, "the new warm count")
    beat = _host(db, "host-t").heartbeat_at
    wait_until(lambda: _host(db, "host-t").heartbeat_at > beat, 10, "another beat")
    hb.drain()
    wait_until(lambda: _host(db, "host-t").state == "draining", 10, "draining")
    hb.stop()
    stopped = _host(db, "host-t")
    assert stopped.state == "stopped" and not stopped.alive
    time.sleep(0.2)  # no beat after the stop
    assert _host(db, "host-t").heartbeat_at == stopped.heartbeat_at


def test_a_second_process_with_the_same_id_takes_the_row_and_the_first_gives_way(
    db: Database,
    beats: list[hosts.HostHeartbeat],
    caplog: pytest.LogCaptureFixture,
) -> None:
    first = hosts.HostHeartbeat(db, host_id="dup", version="1", concurrency=1, interval_s=0.05)
    beats.append(first.start())
    second = hosts.HostHeartbeat(db, host_id="dup", version="1", concurrency=1, interval_s=0.05)
    with caplog.at_level("WARNING"):
        beats.append(second.start())
    assert "takes it over" in caplog.text
    assert _host(db, "dup").instance == second.instance
    # The first's beats are refused and it does not fight for the row while the second lives.
    wait_until(lambda: "held by another live process" in caplog.text, 10, "the first process's complaint")
    time.sleep(0.3)
    assert _host(db, "dup").instance == second.instance and _host(db, "dup").alive
    # Once the second stops, the first (still running) registers again.
    second.stop()
    wait_until(
        lambda: _host(db, "dup").instance == first.instance and _host(db, "dup").state == "up",
        10,
        "the first process back in its row",
    )


def test_a_row_taken_by_a_process_of_this_machine_that_died_is_taken_back_at_once(
    db: Database,
    beats: list[hosts.HostHeartbeat],
) -> None:
    """Two workers of one host id on one machine: the one that took the row is SIGKILLed.
    The other takes the row back at its next beat, long before the row would look dead
    (which would make the leases of the living worker look dead too)."""
    first = hosts.HostHeartbeat(db, host_id="pair", version="1", concurrency=1, interval_s=0.05)
    beats.append(first.start())
    gone = subprocess.Popen(["true"])
    gone.wait()
    _register(db, host_id="pair", instance=f"{gone.pid}:dead", hostname=socket.gethostname(), pid=gone.pid)
    t0 = time.monotonic()
    wait_until(lambda: _host(db, "pair").instance == first.instance, 10, "the row taken back")
    assert time.monotonic() - t0 < hosts.ALIVE_WINDOW_S / 3 and _host(db, "pair").alive


def test_a_heartbeat_that_finds_its_row_gone_registers_again(db: Database, beats: list[hosts.HostHeartbeat]) -> None:
    hb = hosts.HostHeartbeat(db, host_id="gone", version="1", concurrency=1, interval_s=0.05)
    beats.append(hb.start())
    with db.write() as session:
        session.query(HostRow).delete()
    wait_until(lambda: hosts.get_host(db, "gone") is not None, 10, "the row made again")


def test_a_heartbeat_survives_a_failing_warm_count(db: Database, beats: list[hosts.HostHeartbeat]) -> None:
    def broken() -> int:
        raise RuntimeError("docker is away")

    hb = hosts.HostHeartbeat(db, host_id="nodocker", version="1", concurrency=1, warm_count=broken, interval_s=0.05)
    beats.append(hb.start())
    beat = _host(db, "nodocker").heartbeat_at
    wait_until(lambda: _host(db, "nodocker").heartbeat_at > beat, 10, "beats without Docker")
    assert _host(db, "nodocker").warm_containers is None


# -- the CLI and the API --------------------------------------------------------------


def test_the_cli_writes_the_stores_window() -> None:
    assert cli_fleet.ALIVE_WINDOW_S == hosts.ALIVE_WINDOW_S
    assert hosts.HEARTBEAT_INTERVAL_S * 3 <= hosts.ALIVE_WINDOW_S <= 15


def test_the_api_lists_hosts_behind_the_token(db: Database, settings: Settings) -> None:
    _register(db)
    _register(db, host_id="host-b", instance="2:bb")
    _set_heartbeat_back(db, "host-b", 30)
    token = "t0ken-for-hosts"
    with TestClient(create_app(Orchestrator(settings.replace(**{"api_token": token})))) as client:
        assert client.get("/api/hosts").status_code == 401
        ok = {"Authorization": f"Bearer {token}"}
        r = client.get("/api/hosts", headers=ok)
        assert r.status_code == 200, r.text
        body = {h["host_id"]: h for h in r.json()}
        assert set(body) == {"host-a", "host-b"}
        assert body["host-a"]["alive"] is True and body["host-b"]["alive"] is False
        assert body["host-a"]["state"] == "up" and body["host-a"]["concurrency"] == 3
        assert {"runs", "groups", "warm_containers", "heartbeat_age_s", "pid", "version"} <= set(body["host-a"])
        wide = {h["host_id"]: h["alive"] for h in client.get("/api/hosts?window_s=60", headers=ok).json()}
        assert wide == {"host-a": True, "host-b": True}
        assert client.get("/api/hosts?window_s=-1", headers=ok).status_code == 400
