"""Scheduled tasks: validation, firing once per due time, pause/resume/cancel."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from orchestrator.core.errors import InvalidMessage, StoreError, UnknownGroup
from orchestrator.run.schedules import add_task, change_state, fire_due, get_task, is_isolated, next_due
from orchestrator.store.db import Database
from orchestrator.store.groups import add_group, get_group
from orchestrator.store.message_log import get_messages_after
from tests.conftest import run_in_threads

T0 = datetime(2026, 11, 26, 12, 0, tzinfo=UTC)


@pytest.fixture
def team(db: Database) -> str:
    add_group(db, chat_jid="team@g.us", name="team", folder="team", requires_trigger=True)
    return "team@g.us"


@pytest.mark.parametrize(
    ("kind", "spec", "needle"),
    [
        ("cron", "61 * * * *", "cron line"),
        ("cron", "every day", "cron line"),
        ("interval", "soon", "interval"),
        ("interval", "0.5s", "shorter than one second"),
        ("once", "tomorrow", "ISO-8601"),
        ("once", "2020-01-01T00:00:00", "in the past"),
    ],
)
def test_bad_schedules_are_refused(db: Database, team: str, kind: str, spec: str, needle: str) -> None:
    with pytest.raises(InvalidMessage, match=needle):
        add_task(db, chat_jid=team, prompt="p", kind=kind, spec=spec, now=T0)  # type: ignore[arg-type]


def test_unknown_group_and_empty_prompt(db: Database, team: str) -> None:
    with pytest.raises(UnknownGroup):
        add_task(db, chat_jid="nobody@g.us", prompt="p", kind="interval", spec="1h", now=T0)
    with pytest.raises(InvalidMessage):
        add_task(db, chat_jid=team, prompt="  ", kind="interval", spec="1h", now=T0)


def test_next_due() -> None:
    assert next_due("cron", "0 9 * * *", T0) == datetime(2026, 11, 27, 9, 0, tzinfo=UTC)
    assert next_due("interval", "30m", T0) == T0 + timedelta(minutes=30)
    assert next_due("once", "2026-11-26T13:00:00+00:00", T0) == T0 + timedelta(hours=1)
    assert next_due("once", "2026-11-26T11:00:00+00:00", T0) is None


def test_interval_task_fires_once_per_due_time_and_wakes_the_group(db: Database, team: str) -> None:
    task = add_task(db, chat_jid=team, prompt="check the build", kind="interval", spec="10m", now=T0)
    signals: list[str] = []
    assert fire_due(db, signal=signals.append, now=T0 + timedelta(minutes=5)) == []
    due = T0 + timedelta(minutes=10)
    fired = fire_due(db, signal=signals.append, now=due)
    assert len(fired) == 1 and signals == [team]
    assert fire_due(db, signal=signals.append, now=due) == []  # the same due time never fires twice
    [msg] = get_messages_after(team, 0, db=db)
    assert msg.sender == "scheduler" and msg.content == "check the build"
    assert msg.metadata and msg.metadata["scheduled_task"] == task.id
    # A trigger-only group is woken without "@Andy": the task asked for it.
    assert get_group(db, team).pending_seq == msg.seq
    assert get_task(db, task.id).next_run_at == due + timedelta(minutes=10)


def test_missed_slots_fire_once_not_in_a_burst(db: Database, team: str) -> None:
    task = add_task(db, chat_jid=team, prompt="p", kind="interval", spec="1m", now=T0)
    late = T0 + timedelta(hours=3)
    assert len(fire_due(db, signal=None, now=late)) == 1
    assert get_task(db, task.id).next_run_at == late + timedelta(minutes=1)


def test_concurrent_tickers_fire_one_due_time_once(db: Database, team: str) -> None:
    add_task(db, chat_jid=team, prompt="p", kind="cron", spec="*/5 * * * *", now=T0)
    due = T0 + timedelta(minutes=5)
    results: list[list[str]] = []
    assert run_in_threads(lambda _: results.append(fire_due(db, signal=None, now=due)), 4) == []
    assert sum(len(r) for r in results) == 1
    assert len(get_messages_after(team, 0, db=db)) == 1


def test_once_task_is_done_after_firing(db: Database, team: str) -> None:
    task = add_task(
        db, chat_jid=team, prompt="p", kind="once", spec="2026-11-26T12:30:00Z", now=T0, context_mode="isolated"
    )
    [mid] = fire_due(db, signal=None, now=T0 + timedelta(hours=1))
    done = get_task(db, task.id)
    assert done.state == "done" and done.next_run_at is None and done.runs == 1
    [msg] = get_messages_after(team, 0, db=db)
    assert msg.id == mid and is_isolated(msg.metadata)


def test_pause_resume_cancel(db: Database, team: str) -> None:
    task = add_task(db, chat_jid=team, prompt="p", kind="interval", spec="10m", now=T0)
    assert change_state(db, task.id[:8], "pause").state == "paused"
    assert fire_due(db, signal=None, now=T0 + timedelta(hours=1)) == []
    with pytest.raises(StoreError):
        change_state(db, task.id, "pause")
    resumed = change_state(db, task.id, "resume", now=T0 + timedelta(hours=1))
    assert resumed.state == "active"
    assert resumed.next_run_at == T0 + timedelta(hours=1, minutes=10)  # what fell due while paused is skipped
    assert change_state(db, task.id, "cancel").state == "cancelled"
    assert fire_due(db, signal=None, now=T0 + timedelta(days=1)) == []
    with pytest.raises(StoreError):
        change_state(db, task.id, "resume")
