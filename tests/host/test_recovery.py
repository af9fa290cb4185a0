"""Fast recovery on both databases, with a fake sandbox: a group whose lease holder is
gone is taken over at once and what the dead holder left is closed before the next run
(``sweeper.recover_group``: nothing answered twice, nothing lost); a dead host's leases
are dead before they expire (the sweep); every worker's watch signals such groups
(``orchestrator/run/recovery.py``).  The worker-process version, with SIGKILL, is
``tests/integration/test_recovery.py``."""

from __future__ import annotations

import subprocess
from datetime import UTC, datetime, timedelta

from sqlalchemy import update

from agent_runner.protocol import AssistantEvent, ResultEvent
from fakes.clock import FakeClock
from fakes.sandbox import FakeSandbox, Script
from orchestrator.core.settings import Settings
from orchestrator.model.messages import StoredMessage
from orchestrator.run.ingest import IncomingMessage, ingest
from orchestrator.run.outbound import ChannelRegistry
from orchestrator.run.pipeline import Pipeline
from orchestrator.run.recovery import RecoveryWatch, dead_holders
from orchestrator.run.sweeper import recover_group, sweep
from orchestrator.store import hosts, leases
from orchestrator.store.db import Database
from orchestrator.store.groups import add_group, ensure_main_group, get_group
from orchestrator.store.message_log import get_messages_after, now_iso, store_message_direct
from orchestrator.store.runs import create_run, get_run, list_runs, park_run, set_container
from orchestrator.store.tables import GroupRow, HostRow

JID = "main@local"
OK = Script([AssistantEvent(text="the answer"), ResultEvent()])


def _dead_pid() -> int:
    proc = subprocess.Popen(["true"])
    proc.wait()
    return proc.pid


def _say(db: Database, settings: Settings, text: str = "hi") -> StoredMessage:
    return ingest(db, settings, IncomingMessage(chat_jid=JID, sender="u", content=text), signal=None).message


def _replies(db: Database, jid: str = JID) -> list[str]:
    return [m.content for m in get_messages_after(jid, 0, db=db) if m.sender == "bot"]


def _notes(db: Database) -> list[str]:
    return [m.content for m in get_messages_after(JID, 0, db=db) if m.message_type == "host"]


def _killed_mid_run(db: Database, settings: Settings, *, replied: bool) -> tuple[str, str, int]:
    """A worker of this host took the group, started a run (and stored a reply if
    ``replied``), then was SIGKILLed: its lease is live for another minute."""
    ensure_main_group(db)
    msg = _say(db, settings)
    dead = f"{settings.fleet.effective_host_id}:{_dead_pid()}:0badf00d"
    assert leases.acquire(db, JID, dead, 60)
    run = create_run(db, chat_jid=JID, cursor_from=0, cursor_to=msg.seq, celery_task_id=None, owner=dead)
    set_container(db, run.id, "c0ffee")
    if replied:
        store_message_direct(
            db=db,
            id=f"{run.id}-0001",
            chat_jid=JID,
            sender="bot",
            sender_name="Andy",
            content="half an answer",
            timestamp=now_iso(),
            is_from_me=True,
            message_type="assistant",
        )
    return dead, run.id, msg.seq


def _pipeline(settings: Settings, db: Database, sandbox: FakeSandbox) -> Pipeline:
    return Pipeline(settings, db, ChannelRegistry(), sandbox, clock=FakeClock())


def test_a_dead_holders_group_is_taken_over_and_answered_once(settings: Settings, db: Database) -> None:
    dead, run_id, _ = _killed_mid_run(db, settings, replied=False)
    sandbox = FakeSandbox(OK)
    [outcome] = _pipeline(settings, db, sandbox).drain_group(JID)
    # Well before the lease's expiry: the dead run closed, its message answered by the new run, once.
    left = get_run(db, run_id)
    assert left.state == "failed" and "interrupted before any output" in (left.error or "")
    assert outcome.run.state == "succeeded" and len(sandbox.started) == 1
    assert _replies(db) == ["the answer"] and _notes(db) == []
    assert [r.state for r in list_runs(db, chat_jid=JID)] == ["succeeded", "failed"]


def test_a_dead_holder_that_had_answered_is_not_answered_again(settings: Settings, db: Database) -> None:
    _, run_id, seq = _killed_mid_run(db, settings, replied=True)
    sandbox = FakeSandbox(OK)
    assert _pipeline(settings, db, sandbox).drain_group(JID) == []
    # Never replayed: the cursor moved past its input and people are told it was cut short.
    assert sandbox.started == [] and get_group(db, JID).cursor_seq == seq
    assert _replies(db) == ["half an answer"] and len(_notes(db)) == 1 and "interrupted" in _notes(db)[0]
    assert "interrupted after output" in (get_run(db, run_id).error or "")


def test_recover_group_leaves_the_holders_own_and_parked_runs(settings: Settings, db: Database) -> None:
    ensure_main_group(db)
    msg = _say(db, settings)
    me = hosts.process_owner(settings.fleet.effective_host_id)
    assert leases.acquire(db, JID, me, 60)
    mine = create_run(db, chat_jid=JID, cursor_from=0, cursor_to=msg.seq, celery_task_id=None, owner=me)
    parked = create_run(db, chat_jid=JID, cursor_from=0, cursor_to=msg.seq, celery_task_id=None, owner="w:1:ab")
    park_run(
        db,
        parked.id,
        attempts=2,
        error="crash",
        retry_at=datetime.now(UTC) + timedelta(minutes=1),
        input_tokens=0,
        output_tokens=0,
    )
    orphan = create_run(db, chat_jid=JID, cursor_from=0, cursor_to=msg.seq, celery_task_id=None, owner=None)
    assert recover_group(db, JID, me) == [orphan.id]
    assert get_run(db, mine.id).finished_at is None and get_run(db, parked.id).finished_at is None
    assert recover_group(db, JID, me) == []  # safe to repeat


def _silence(db: Database, host_id: str, seconds: float = hosts.ALIVE_WINDOW_S + 5) -> None:
    then = hosts.database_now(db) - timedelta(seconds=seconds)
    with db.write() as session:
        session.execute(update(HostRow).where(HostRow.host_id == host_id).values(heartbeat_at=then))


def test_the_sweep_closes_a_dead_hosts_runs_before_its_leases_expire(settings: Settings, db: Database) -> None:
    ensure_main_group(db)
    msg = _say(db, settings)
    hosts.register(db, host_id="host-b", instance="1:b", version="t", concurrency=1)
    theirs = hosts.process_owner("host-b")
    assert leases.acquire(db, JID, theirs, 60)
    run = create_run(db, chat_jid=JID, cursor_from=0, cursor_to=msg.seq, celery_task_id=None, owner=theirs)
    signals: list[str] = []
    assert sweep(db, signal=signals.append).interrupted_runs == [] and signals == []  # host-b is alive
    _silence(db, "host-b")
    report = sweep(db, signal=signals.append)
    assert report.interrupted_runs == [run.id] and signals == [JID]
    # The signalled worker may take the lease at once (it has not expired).
    assert leases.acquire(db, JID, hosts.process_owner("host-c"), 60)


def test_the_watch_signals_groups_whose_holder_is_gone(settings: Settings, db: Database) -> None:
    me = "host-a"
    for name in ("local", "remote", "live", "expired", "free"):
        add_group(db, chat_jid=f"{name}@x", name=name, folder=name)
    hosts.register(db, host_id="host-b", instance="1:b", version="t", concurrency=1)
    assert leases.acquire(db, "local@x", f"{me}:{_dead_pid()}:ab", 60)  # SIGKILLed on this host
    assert leases.acquire(db, "remote@x", hosts.process_owner("host-b"), 60)  # its host goes silent
    assert leases.acquire(db, "live@x", hosts.process_owner(me), 60)  # this very process
    assert leases.acquire(db, "expired@x", f"host-z:{_dead_pid()}:ab", 60)  # another host's, expired
    with db.write() as session:
        session.execute(
            update(GroupRow)
            .where(GroupRow.chat_jid == "expired@x")
            .values(lease_expires_at=hosts.database_now(db) - timedelta(seconds=1))
        )
    assert dead_holders(db, me) == [
        ("expired@x", f"host-z:{_pid_of(db, 'expired@x')}:ab"),
        ("local@x", f"{me}:{_pid_of(db, 'local@x')}:ab"),
    ]
    _silence(db, "host-b")
    clock = [0.0]
    signals: list[str] = []
    watch = RecoveryWatch(
        db, host_id=me, signal=signals.append, interval_s=1, resignal_s=30, monotonic=lambda: clock[0]
    )
    assert watch.check() == ["expired@x", "local@x", "remote@x"] == signals
    assert watch.check() == []  # not again for the same holders so soon
    clock[0] = 31
    assert watch.check() == ["expired@x", "local@x", "remote@x"]
    # Once a worker took a group over, its new holder is alive: no more signals for it.
    assert leases.acquire(db, "local@x", hosts.process_owner(me), 60)
    clock[0] = 62
    assert watch.check() == ["expired@x", "remote@x"]


def test_the_watch_stops_at_a_broker_failure_and_tries_again(settings: Settings, db: Database) -> None:
    for name in ("a", "b"):
        add_group(db, chat_jid=f"{name}@x", name=name, folder=name)
        assert leases.acquire(db, f"{name}@x", f"host-a:{_dead_pid()}:ab", 60)
    calls: list[str] = []
    broker_up = False

    def signal(jid: str) -> None:
        calls.append(jid)
        if not broker_up:
            raise ConnectionError("broker away")

    watch = RecoveryWatch(db, host_id="host-a", signal=signal, interval_s=1)
    assert watch.check() == [] and calls == ["a@x"]  # one failed signal, then the next look
    broker_up = True
    assert watch.check() == ["a@x", "b@x"]


def _pid_of(db: Database, jid: str) -> int:
    with db.read() as session:
        row = session.get(GroupRow, jid)
        assert row is not None
        pid = hosts.owner_pid(row.lease_owner)
    assert pid is not None
    return pid
