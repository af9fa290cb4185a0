"""The fleet's run cap and its priority lanes (issue 14, ``ORCHESTRATOR_MAX_CONCURRENT_RUNS``;
``orchestrator/store/slots.py``), on both databases.

Several pipelines in threads share one fake sandbox (``fakes/sandbox.py``),
which counts the agents alive at once; a gated script holds a run open.  The
cap is never exceeded, a group over it waits in line where people can see it
(``runs waiting``, ``GET /api/runs/waiting``), and a freed slot goes to a
person's message before scheduled tasks and to the main group before others.
The Celery side of it (a run that ends signals the next in line) is
``workers/tasks.py``; real workers and containers: ``tests/integration/test_run_cap.py``.
"""

from __future__ import annotations

import json
import os
import queue
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
from fastapi.testclient import TestClient
from sqlalchemy import update

from agent_runner.protocol import AssistantEvent, ResultEvent
from fakes.sandbox import FakeSandbox, Script
from orchestrator.core.clock import SYSTEM_CLOCK
from orchestrator.core.errors import FleetFull
from orchestrator.core.settings import Settings
from orchestrator.http.api import create_app
from orchestrator.root import Orchestrator
from orchestrator.run.ingest import IncomingMessage, ingest
from orchestrator.run.outbound import ChannelRegistry
from orchestrator.run.pipeline import Pipeline, Step
from orchestrator.run.schedules import add_task, fire_due
from orchestrator.store.db import Database
from orchestrator.store.groups import MAIN_JID, add_group, ensure_main_group
from orchestrator.store.message_log import get_messages_after
from orchestrator.store.runs import list_runs
from orchestrator.store.slots import RECHECK_S, STALE_S, fleet_slots, take_slot, to_wake
from orchestrator.store.tables import RunWaitRow
from tests.conftest import TEST_ENV, run_in_threads, wait_until

DONE = [AssistantEvent(text="done"), ResultEvent()]


class Pause(threading.Event):
    """A script's gate that holds each run open a little while (so runs overlap), then lets it end."""

    def wait(self, timeout: float | None = None) -> bool:
        time.sleep(0.05)
        return True


def _groups(db: Database, *names: str) -> list[str]:
    for name in names:
        add_group(db, chat_jid=f"{name}@g.us", name=name, folder=name, requires_trigger=False)
    return [f"{name}@g.us" for name in names]


def _say(db: Database, settings: Settings, jid: str, text: str = "hi", sender: str = "ann") -> None:
    ingest(db, settings, IncomingMessage(chat_jid=jid, sender=sender, content=text), signal=None)


def _schedule(db: Database, jids: list[str]) -> None:
    """A scheduled task fires in each group: its prompt stored as the scheduler's message."""
    now = datetime.now(UTC)
    for jid in jids:
        add_task(
            db, chat_jid=jid, prompt="the daily report", kind="once", spec=(now + timedelta(minutes=1)).isoformat()
        )
    assert len(fire_due(db, signal=None, now=now + timedelta(minutes=2))) == len(jids)


def _pipeline(settings: Settings, db: Database, sandbox: FakeSandbox) -> Pipeline:
    return Pipeline(settings, db, ChannelRegistry(), sandbox, clock=SYSTEM_CLOCK)


def _replies(db: Database, jid: str) -> list[str]:
    return [m.content for m in get_messages_after(jid, 0, db=db) if m.sender == "bot"]


def _serve(pipelines: list[Pipeline], signals: list[str], cap: int, done: Callable[[], bool]) -> None:
    """Serve ``signals`` as a task queue would: one step per signal, each pipeline a worker slot;
    a waiting group asks again (after 0.1 s here, not RECHECK_S), a step that ended a run signals
    the groups next in line (what ``workers/tasks.py`` does)."""
    signalled: queue.Queue[str] = queue.Queue()
    for jid in signals:
        signalled.put(jid)
    stop = threading.Event()
    errors: list[BaseException] = []

    def slot(p: Pipeline) -> None:
        while not stop.is_set():
            try:
                jid = signalled.get(timeout=0.05)
            except queue.Empty:
                continue
            try:
                step = p.step(jid)
                if step.freed_slot:
                    for waiting in to_wake(p.db, cap):
                        signalled.put(waiting)
                if step.retry_in is not None:
                    threading.Timer(0.1, signalled.put, [jid]).start()
                elif step.more:
                    signalled.put(jid)
            except BaseException as exc:  # noqa: BLE001 - reported to the test
                errors.append(exc)
                stop.set()

    threads = [threading.Thread(target=slot, args=(p,)) for p in pipelines]
    for t in threads:
        t.start()
    try:
        wait_until(lambda: done() or bool(errors), 60, "every group to be answered")
    finally:
        stop.set()
        for t in threads:
            t.join(30)
    assert errors == []


def test_the_cap_is_never_exceeded_and_the_groups_over_it_wait_in_line(settings: Settings, db: Database) -> None:
    s = settings.replace(max_concurrent_runs=2)
    jids = _groups(db, *(f"g{i}" for i in range(6)))
    for jid in jids:
        _say(db, s, jid)
    gate = threading.Event()
    # The first two runs are held open until the gate opens; the later ones overlap a little.
    sandbox = FakeSandbox(Script(DONE, gate=gate), Script(DONE, gate=gate), Script(DONE, gate=Pause()))
    steps: dict[str, Step] = {}

    def first_step(i: int) -> None:
        steps[jids[i]] = _pipeline(s, db, sandbox).step(jids[i])

    threads = [threading.Thread(target=first_step, args=(i,)) for i in range(6)]
    for t in threads:
        t.start()
    wait_until(lambda: len(steps) == 4 and len(sandbox.started) == 2, 30, "two runs and four groups waiting")
    time.sleep(0.3)
    assert len(sandbox.started) == 2 and sandbox.peak == 2
    waiting = sorted(jid for jid, step in steps.items() if step.waiting is not None)
    assert len(waiting) == 4 and all(steps[j].retry_in == RECHECK_S and steps[j].outcome is None for j in waiting)
    # Nothing of theirs started: no run row, and the line says who waits and in which order.
    assert {r.chat_jid for r in list_runs(db, limit=50)} == set(jids) - set(waiting)
    line = fleet_slots(db, 2)
    assert (line.cap, line.running) == (2, 2)
    assert sorted(w.chat_jid for w in line.waiting) == waiting
    assert [w.position for w in line.waiting] == [1, 2, 3, 4]
    assert all(w.lane == "person" and not w.is_main for w in line.waiting)
    assert [w.since for w in line.waiting] == sorted(w.since for w in line.waiting)  # the oldest wait first
    assert to_wake(db, 4) == [w.chat_jid for w in line.waiting][:2]  # two more slots: the first two in line

    gate.set()
    for t in threads:
        t.join(30)
    _serve(
        [_pipeline(s, db, sandbox) for _ in range(4)],
        waiting,
        2,
        lambda: all(_replies(db, jid) == ["done"] for jid in jids),
    )
    assert sandbox.peak == 2 and len(sandbox.started) == 6
    assert all(_replies(db, jid) == ["done"] for jid in jids)  # each answered once
    assert fleet_slots(db, 2).waiting == [] and fleet_slots(db, 2).running == 0


def test_a_freed_slot_goes_to_a_person_before_scheduled_tasks_and_to_main_before_others(
    settings: Settings, db: Database
) -> None:
    s = settings.replace(max_concurrent_runs=1)
    ensure_main_group(db)
    busy, ann = _groups(db, "busy", "ann")
    scheduled = _groups(db, *(f"s{i:02d}" for i in range(20)))
    gate = threading.Event()
    sandbox = FakeSandbox(Script(DONE, gate=gate))
    _say(db, s, busy)
    holder: list[Step] = []
    running = threading.Thread(target=lambda: holder.append(_pipeline(s, db, sandbox).step(busy)))
    running.start()
    assert sandbox.agent_started.wait(30)

    p = _pipeline(s, db, sandbox)
    _schedule(db, scheduled)
    for n, jid in enumerate(scheduled, 1):
        wait = p.step(jid).waiting
        assert wait is not None and (wait.lane, wait.is_main, wait.position) == ("scheduled", False, n)
    _say(db, s, ann)
    wait = p.step(ann).waiting
    assert wait is not None and (wait.lane, wait.position) == ("person", 1)  # ahead of 20 scheduled runs
    _say(db, s, MAIN_JID)
    wait = p.step(MAIN_JID).waiting
    assert wait is not None and (wait.lane, wait.is_main, wait.position) == ("person", True, 1)
    assert [w.chat_jid for w in fleet_slots(db, 1).waiting] == [MAIN_JID, ann, *scheduled]
    assert to_wake(db, 1) == []  # the one slot is taken

    gate.set()
    running.join(30)
    assert holder[0].freed_slot and to_wake(db, 1) == [MAIN_JID]
    # However the others' re-checks come before main's signal, none of them takes its slot.
    for jid in [*reversed(scheduled), ann]:
        assert p.step(jid).waiting is not None
    assert len(sandbox.started) == 1
    step = p.step(MAIN_JID)
    assert step.freed_slot and step.outcome is not None and step.outcome.run.state == "succeeded"
    assert to_wake(db, 1) == [ann]
    for jid in reversed(scheduled):
        assert p.step(jid).waiting is not None
    assert p.step(ann).freed_slot
    # Then the scheduled runs, the oldest wait first.
    order = []
    while woken := to_wake(db, 1):
        assert p.step(woken[0]).freed_slot
        order.append(woken[0])
    assert order == scheduled
    assert [inp.chat_jid for _, inp in sandbox.started] == [busy, MAIN_JID, ann, *scheduled]
    assert sandbox.peak == 1


def test_the_rank_is_read_afresh_and_a_wait_that_stopped_asking_holds_no_one_back(
    settings: Settings, db: Database
) -> None:
    s = settings.replace(max_concurrent_runs=1)
    busy, early, late = _groups(db, "busy", "early", "late")
    gate = threading.Event()
    sandbox = FakeSandbox(Script(DONE, gate=gate))
    _say(db, s, busy)
    running = threading.Thread(target=lambda: _pipeline(s, db, sandbox).step(busy))
    running.start()
    assert sandbox.agent_started.wait(30)
    p = _pipeline(s, db, sandbox)
    _schedule(db, [early, late])
    assert p.step(early).waiting is not None and p.step(late).waiting is not None
    assert [w.chat_jid for w in fleet_slots(db, 1).waiting] == [early, late]
    # A person writes into the later group: it moves up before its next re-check.
    _say(db, s, late, "@Andy me first")
    assert [(w.chat_jid, w.lane) for w in fleet_slots(db, 1).waiting] == [(late, "person"), (early, "scheduled")]
    # A group that stopped asking (its signal lost, its steps failing) no longer holds others back.
    with db.write() as session:
        session.execute(
            update(RunWaitRow)
            .where(RunWaitRow.chat_jid == late)
            .values(seen_at=datetime.now(UTC) - timedelta(seconds=STALE_S + 5))
        )
    assert [w.chat_jid for w in fleet_slots(db, 1).waiting] == [early]
    gate.set()
    running.join(30)
    assert to_wake(db, 1) == [early]
    assert p.step(early).freed_slot and p.step(late).freed_slot
    assert [inp.chat_jid for _, inp in sandbox.started] == [busy, early, late]


def test_two_workers_never_take_the_last_slot_both(settings: Settings, db: Database) -> None:
    jids = _groups(db, *(f"r{i:02d}" for i in range(12)))
    for jid in jids:
        _say(db, settings, jid)
    admitted: list[str] = []
    refused: list[str] = []

    def admit(i: int) -> None:
        try:
            take_slot(db, 3, chat_jid=jids[i], cursor_from=0, cursor_to=1, celery_task_id=None)
            admitted.append(jids[i])
        except FleetFull as full:
            refused.append(full.wait.chat_jid)

    assert run_in_threads(admit, 12) == []
    assert len(admitted) == 3 and len(refused) == 9
    assert fleet_slots(db, 3).running == 3
    assert sorted(w.chat_jid for w in fleet_slots(db, 3).waiting) == sorted(refused)


def test_the_line_over_http_and_on_the_command_line(settings: Settings, db: Database) -> None:
    s = settings.replace(max_concurrent_runs=1)
    busy, other = _groups(db, "busy", "other")
    for jid in (busy, other):
        _say(db, s, jid)
    take_slot(db, 1, chat_jid=busy, cursor_from=0, cursor_to=1, celery_task_id=None)
    assert _pipeline(s, db, FakeSandbox(Script(DONE))).step(other).waiting is not None

    with TestClient(create_app(Orchestrator(s))) as client:
        r = client.get("/api/runs/waiting")
    assert r.status_code == 200, r.text
    body = r.json()
    assert (body["cap"], body["running"]) == (1, 1)
    assert [(w["chat_jid"], w["lane"], w["position"]) for w in body["waiting"]] == [(other, "person", 1)]

    env = (
        {k: v for k, v in os.environ.items() if not k.startswith("ORCHESTRATOR_")}
        | TEST_ENV
        | {
            "ORCHESTRATOR_DATA_DIR": str(s.data_dir),
            "ORCHESTRATOR_DATABASE_URL": s.database_url,
            "ORCHESTRATOR_MAX_CONCURRENT_RUNS": "1",
        }
    )
    cli = [str(Path(sys.executable).parent / "orchestrator"), "runs", "waiting"]
    shown = subprocess.run(cli, env=env, capture_output=True, text=True, timeout=120)
    assert shown.returncode == 0, shown.stderr
    assert "run slots: 1 taken of 1; 1 group(s) waiting" in shown.stdout
    assert f"1. {other}" in shown.stdout and "person" in shown.stdout
    as_json = subprocess.run([*cli, "--json"], env=env, capture_output=True, text=True, timeout=120)
    assert json.loads(as_json.stdout)["waiting"][0]["chat_jid"] == other


def test_no_cap_no_line(settings: Settings, db: Database) -> None:
    jids = _groups(db, "a", "b", "c")
    for jid in jids:
        _say(db, settings, jid)
    for jid in jids:
        take_slot(db, 0, chat_jid=jid, cursor_from=0, cursor_to=1, celery_task_id=None)
    assert fleet_slots(db, 0).running == 3 and to_wake(db, 0) == []


@pytest.mark.parametrize("cap", [0, 2])
def test_a_run_made_on_a_known_container_is_running_on_it_at_once(settings: Settings, db: Database, cap: int) -> None:
    # The pipeline names the warm container it expects (one write less than queued, then running).
    known, unknown = _groups(db, "known", "unknown")
    on_it = take_slot(db, cap, chat_jid=known, cursor_from=0, cursor_to=1, celery_task_id=None, container_id="c0ffee")
    plain = take_slot(db, cap, chat_jid=unknown, cursor_from=0, cursor_to=1, celery_task_id=None)
    assert (on_it.state, on_it.container_id) == ("running", "c0ffee")
    assert (plain.state, plain.container_id) == ("queued", None)
    stored = {run.id: run for run in list_runs(db, limit=5)}
    assert (stored[on_it.id].state, stored[on_it.id].container_id) == ("running", "c0ffee")
    assert (stored[plain.id].state, stored[plain.id].container_id) == ("queued", None)
    assert fleet_slots(db, cap).running == 2  # both hold a slot either way


def test_migration_0010_adds_the_line(db: Database) -> None:
    from alembic import command
    from alembic.config import Config
    from sqlalchemy import inspect

    from orchestrator.store import db as dbmod

    def alembic(action: str, target: str) -> None:
        with db.engine.begin() as conn:
            cfg = Config()
            cfg.set_main_option("script_location", str(dbmod._MIGRATIONS))
            cfg.attributes["connection"] = conn
            getattr(command, action)(cfg, target)

    alembic("downgrade", "0009")
    assert "run_waits" not in inspect(db.engine).get_table_names()
    alembic("upgrade", "head")
    assert db.schema_revision() == dbmod.SCHEMA_HEAD
    assert {c["name"] for c in inspect(db.engine).get_columns("run_waits")} == {"chat_jid", "since", "seen_at"}


def test_closing_a_dead_holders_run_frees_its_slot_for_the_line(settings: Settings, db: Database) -> None:
    # A worker died after its run had answered: the next step of that group closes
    # the run (sweeper.recover_group) and has nothing left to run.  The slot the
    # dead run held is free, so that step signals the group first in line.
    from orchestrator.model.messages import SENDER_BOT, NewMessage
    from orchestrator.store import leases
    from orchestrator.store.groups import get_group
    from orchestrator.store.message_log import insert_message
    from orchestrator.store.runs import create_run
    from orchestrator.store.tables import GroupRow

    s = settings.replace(max_concurrent_runs=1)
    dead, ann = _groups(db, "dead", "ann")
    _say(db, s, dead)
    pending = get_group(db, dead).pending_seq
    gone = "ghost-host:4242:feed"
    assert leases.acquire(db, dead, gone, 60)
    run = create_run(db, chat_jid=dead, cursor_from=0, cursor_to=pending, celery_task_id=None, owner=gone)
    with db.write() as session:
        insert_message(
            session,
            db,
            NewMessage(
                id=f"{run.id}-0",
                chat_jid=dead,
                sender=SENDER_BOT,
                is_from_me=True,
                content="half an answer",
                timestamp=datetime.now(UTC).isoformat(),
                message_type="assistant",
            ),
        )
        session.execute(
            update(GroupRow)
            .where(GroupRow.chat_jid == dead)
            .values(lease_expires_at=datetime.now(UTC) - timedelta(minutes=5))
        )
    sandbox = FakeSandbox(Script(DONE))
    p = _pipeline(s, db, sandbox)
    _say(db, s, ann)
    assert p.step(ann).waiting is not None  # the dead run holds the one slot
    assert to_wake(db, 1) == []
    step = p.step(dead)
    assert step.recovered == [run.id] and step.outcome is None and not step.more
    assert step.freed_slot and to_wake(db, 1) == [ann]
    signalled: list[tuple[str, float | None]] = []
    p.follow_up(dead, step, lambda jid, countdown: signalled.append((jid, countdown)))
    assert signalled == [(ann, None)]
    assert p.step(ann).outcome is not None and [inp.chat_jid for _, inp in sandbox.started] == [ann]
