"""Group leases: one holder at a time, release, expiry on the database's clock (moved
back by the tests, no sleeps; a host clock or ``Clock`` far off changes nothing), and
holders that are gone: a dead process of this host, a dead host."""

from __future__ import annotations

import logging
import os
import subprocess
import time
from datetime import UTC, datetime, timedelta

import pytest
from sqlalchemy import literal, select, update

from agent_runner.protocol import AssistantEvent, ResultEvent
from fakes.clock import FakeClock
from fakes.sandbox import FakeSandbox, Script
from orchestrator.core.clock import SystemClock
from orchestrator.core.settings import Settings
from orchestrator.run.ingest import IncomingMessage, ingest
from orchestrator.run.outbound import ChannelRegistry
from orchestrator.run.pipeline import Pipeline
from orchestrator.store import hosts, leases
from orchestrator.store.db import Database
from orchestrator.store.groups import add_group, ensure_main_group
from orchestrator.store.tables import GroupRow, HostRow

JID = "main@local"


def test_one_holder_at_a_time(db: Database) -> None:
    ensure_main_group(db)
    assert leases.acquire(db, "main@local", "w1", 30)
    assert not leases.acquire(db, "main@local", "w2", 30)
    assert leases.acquire(db, "main@local", "w1", 30)  # re-entrant for its owner
    leases.release(db, "main@local", "w2")  # not the owner: no effect
    assert not leases.acquire(db, "main@local", "w2", 30)
    leases.release(db, "main@local", "w1")
    assert leases.acquire(db, "main@local", "w2", 30)


def _expiry(db: Database, jid: str = JID) -> datetime:
    with db.read() as session:
        found = session.scalar(select(GroupRow.lease_expires_at).where(GroupRow.chat_jid == jid))
    assert found is not None
    return found


def _expire_in(db: Database, seconds: float, jid: str = JID) -> None:
    """Move the lease's expiry to ``seconds`` from the database's now (negative: past; no sleeping)."""
    then = hosts.database_now(db) + timedelta(seconds=seconds)
    with db.write() as session:
        session.execute(update(GroupRow).where(GroupRow.chat_jid == jid).values(lease_expires_at=then))


def test_a_lease_expires_on_the_databases_clock_and_not_before(db: Database) -> None:
    ensure_main_group(db)
    before = hosts.database_now(db)
    assert leases.acquire(db, JID, "dead-worker", 30)
    # The expiry is the database's now + ttl, read in the acquiring transaction.
    assert before + timedelta(seconds=30) <= _expiry(db) <= hosts.database_now(db) + timedelta(seconds=30)
    _expire_in(db, 1)
    assert not leases.acquire(db, JID, "w2", 30)
    _expire_in(db, -0.01)
    assert leases.acquire(db, JID, "w2", 30)
    assert not leases.renew(db, JID, "dead-worker", 30)


def test_a_heartbeat_keeps_the_lease_while_time_passes(db: Database) -> None:
    clock = FakeClock()
    ensure_main_group(db)
    assert leases.acquire(db, JID, "w1", 30)
    _expire_in(db, 0.5)
    with leases.Heartbeat(db, JID, "w1", 30, clock=clock) as hb:
        # Many beats later (each a jump of ttl/3 on the clock), the lease is still
        # w1's, renewed from the database's now each time.
        while len(clock.waits_of(f"lease-{JID}")) < 12:
            hb.lost.wait(0.01)
        assert not leases.acquire(db, JID, "w2", 30)
        assert _expiry(db) >= hosts.database_now(db) + timedelta(seconds=29)
    assert not hb.lost.is_set()
    _expire_in(db, -0.01)  # no beats since: it runs out
    assert leases.acquire(db, JID, "w2", 30)


@pytest.mark.parametrize("skew_h", [1, -1])
def test_a_host_clock_far_off_changes_no_lease_expiry(
    db: Database,
    settings: Settings,
    monkeypatch: pytest.MonkeyPatch,
    skew_h: int,
) -> None:
    """A worker whose clock is an hour ahead no longer steals a live lease, and one an
    hour behind no longer writes leases that are already expired: the expiry is the
    database's now + ttl, whatever the process's clock (or its ``Clock``) says."""
    off = timedelta(hours=skew_h)
    real_now = SystemClock.now
    monkeypatch.setattr(SystemClock, "now", lambda self: real_now(self) + off)
    skewed = FakeClock(datetime.now(UTC) + off)
    ensure_main_group(db)
    # Held live by another worker: neither acquire nor a pipeline on the skewed clock takes it.
    assert leases.acquire(db, JID, "live-worker", 60)
    assert not leases.acquire(db, JID, "skewed-worker", 60)
    ingest(db, settings, IncomingMessage(chat_jid=JID, sender="u", content="hi"), signal=None)
    sandbox = FakeSandbox(Script([AssistantEvent(text="stolen"), ResultEvent()]))
    pipeline = Pipeline(settings, db, ChannelRegistry(), sandbox, clock=skewed)
    assert pipeline.drain_group(JID) == [] and sandbox.started == []
    leases.release(db, JID, "live-worker")
    # The skewed worker's own lease, renewed by its heartbeat: on the database's clock.
    assert leases.acquire(db, JID, "skewed-worker", 60)
    with leases.Heartbeat(db, JID, "skewed-worker", 60, clock=skewed) as hb:
        while len(skewed.waits_of(f"lease-{JID}")) < 3:
            hb.lost.wait(0.01)
    now = hosts.database_now(db)
    assert now + timedelta(seconds=55) < _expiry(db) <= now + timedelta(seconds=60)
    assert not leases.acquire(db, JID, "live-worker", 60)


# -- holders that are gone ------------------------------------------------------------


def _dead_pid() -> int:
    proc = subprocess.Popen(["true"])
    proc.wait()  # reaped: the pid names no process (until reused)
    return proc.pid


def test_a_lease_of_a_dead_process_of_this_host_is_taken_over_at_once(
    db: Database,
    caplog: pytest.LogCaptureFixture,
) -> None:
    ensure_main_group(db)
    dead = f"host-a:{_dead_pid()}:0badf00d"
    assert leases.acquire(db, JID, dead, 60)
    # Another host cannot judge the pid: it waits for the expiry (or that host's death).
    assert not leases.acquire(db, JID, hosts.process_owner("host-b"), 60)
    # A process of the same host can: it takes the lease over, and says so.
    mine = hosts.process_owner("host-a")
    with caplog.at_level(logging.WARNING, logger="orchestrator.store.leases"):
        assert leases.acquire(db, JID, mine, 60)
    assert "took over the lease of main@local" in caplog.text and dead in caplog.text
    assert not leases.renew(db, JID, dead, 60)
    assert _expiry(db) > hosts.database_now(db) + timedelta(seconds=55)


def test_a_lease_of_a_live_process_or_a_zombie(db: Database) -> None:
    ensure_main_group(db)
    live = subprocess.Popen(["sleep", "60"])
    try:
        assert leases.acquire(db, JID, f"host-a:{live.pid}:11111111", 60)
        assert not leases.acquire(db, JID, hosts.process_owner("host-a"), 60)  # it runs: not taken
        live.kill()
        time.sleep(0.2)  # not reaped yet: a zombie, which runs nothing
        assert hosts.pid_running(os.getpid()) and not hosts.pid_running(live.pid)
        assert leases.acquire(db, JID, hosts.process_owner("host-a"), 60)
    finally:
        live.kill()
        live.wait()


def test_pid_checks() -> None:
    assert hosts.owner_pid("rack:1:4242:abcd") == 4242 and hosts.owner_pid("history:abcd") is None
    assert not hosts.gone_from_this_host(f"host-a:{os.getpid()}:ab", "host-a")  # this process
    assert hosts.gone_from_this_host(f"host-a:{_dead_pid()}:ab", "host-a")
    assert not hosts.gone_from_this_host(f"host-b:{_dead_pid()}:ab", "host-a")  # not this host's
    assert not hosts.gone_from_this_host("history:abcd", "history")


def test_a_pid_that_may_not_be_signalled_runs(monkeypatch: pytest.MonkeyPatch) -> None:
    def refuse(pid: int, sig: int) -> None:
        raise PermissionError

    monkeypatch.setattr(hosts.os, "kill", refuse)
    assert hosts.pid_running(1)


def _register(db: Database, host_id: str) -> None:
    hosts.register(db, host_id=host_id, instance=f"{host_id}:1", version="t", concurrency=1)


def test_a_lease_held_on_a_dead_host_is_dead_before_it_expires(db: Database) -> None:
    ensure_main_group(db)
    for jid in ("b@x", "c@x"):
        add_group(db, chat_jid=jid, name=jid, folder=jid.split("@")[0])
    # Host ids that are prefixes of each other, or hold LIKE's wildcards, are told apart.
    for host_id in ("rack", "rack:1", "w_1", "wx1"):
        _register(db, host_id)
    assert leases.acquire(db, JID, hosts.process_owner("rack"), 60)
    assert leases.acquire(db, "b@x", hosts.process_owner("rack:1"), 60)
    assert leases.acquire(db, "c@x", hosts.process_owner("wx1"), 60)
    for host_id in ("rack", "w_1"):  # silent for 20 s by the database's clock
        then = hosts.database_now(db) - timedelta(seconds=hosts.ALIVE_WINDOW_S + 5)
        with db.write() as session:
            session.execute(update(HostRow).where(HostRow.host_id == host_id).values(heartbeat_at=then))
    other = hosts.process_owner("elsewhere")
    assert leases.acquire(db, JID, other, 60)  # rack is dead: its unexpired lease is free
    assert not leases.acquire(db, "b@x", other, 60)  # rack:1 is alive
    assert not leases.acquire(db, "c@x", other, 60)  # wx1 is alive (w_1 is not its pattern)
    hosts.mark_stopped(db, "wx1", "wx1:1")
    assert leases.acquire(db, "c@x", other, 60)  # stopped: dead at once
    # Owners of no listed host (history operations, unregistered processes) wait for the expiry.
    leases.release(db, JID, other)
    assert leases.acquire(db, JID, "history:abcd", 60)
    assert not leases.acquire(db, JID, other, 60)


def test_the_fixed_dead_owner_sql_agrees_with_the_expression(db: Database) -> None:
    """``hosts.dead_owner_sql`` (``leases.take``'s, on the driver) and ``hosts.on_dead_host``
    (the sweeper's and the recovery's) give every owner the same verdict."""
    for host_id in ("rack", "rack:1", "w_1", "wx1", "quiet", "down"):
        _register(db, host_id)
    then = hosts.database_now(db) - timedelta(seconds=hosts.ALIVE_WINDOW_S + 5)
    with db.write() as session:
        session.execute(update(HostRow).where(HostRow.host_id.in_(("rack", "quiet"))).values(heartbeat_at=then))
    hosts.mark_stopped(db, "down", "down:1")
    owners = [
        "rack:1:ab",
        "rack:1:2:ab",
        "w_1:3:ab",
        "wx1:3:ab",
        "wy1:3:ab",
        "quiet:4:cd",
        "quiet:4",
        "quiet:4:cd:ef",
        "down:9:aa",
        "history:abcd",
        "elsewhere:1:ab",
        "RACK:1:ab",
    ]
    fixed = f"SELECT {hosts.dead_owner_sql(':owner', sqlite=db.is_sqlite)}"
    verdicts = {}
    for owner in owners:
        with db.read() as session:
            expected = bool(session.scalar(select(hosts.on_dead_host(literal(owner), hosts.database_now(db)))))
        got = bool(db.read_fixed(fixed, {"owner": owner, "window": hosts.ALIVE_WINDOW_S})[0][0])
        assert got == expected, owner
        verdicts[owner] = got
    # The cases themselves: a dead host's owners are dead, a live one's and strangers' are not.
    assert verdicts["rack:1:ab"] and verdicts["quiet:4:cd"] and verdicts["down:9:aa"]
    assert not verdicts["rack:1:2:ab"] and not verdicts["wx1:3:ab"] and not verdicts["history:abcd"]


def test_a_lost_lease_stops_the_run_from_the_thread_that_finds_it_and_never_after_its_end(db: Database) -> None:
    """The stop-watch kills the container from the thread that sets the lease lost (no
    thread of its own polling it, no wait for its poll), and not once the run is over."""
    from orchestrator.run.stop_watch import StopWatch

    stopped: list[str] = []
    lost = leases.LostSignal()
    with StopWatch(db, "run-1", lambda: stopped.append("killed"), lost, interval_s=3600) as watch:
        lost.set()
        assert stopped == ["killed"] and watch.reason == "lease_lost"  # at once, in this thread
        lost.set()
        assert stopped == ["killed"]  # once
    later = leases.LostSignal()
    with StopWatch(db, "run-2", lambda: stopped.append("late"), later, interval_s=3600) as watch:
        pass
    later.set()
    assert stopped == ["killed"] and watch.reason is None
