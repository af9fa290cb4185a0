"""The limits on the agent's scheduled tasks hold for every schedule kind (issue 44, finding 2),
decided on the host through runs of the pipeline with the fake sandbox, on both databases: a
cron line with seconds and one whose due times come closer than
``ORCHESTRATOR_AGENT_TASK_MIN_INTERVAL_S`` are refused with the reason in the chat; a time once
is at least that far ahead and counts toward the cap; the agent changes only the tasks it made,
while the operator keeps its own rules."""

from __future__ import annotations

import itertools
from datetime import UTC, datetime, timedelta

import pytest
from croniter import croniter

from agent_runner.protocol import AssistantEvent, Event, TaskEvent
from orchestrator.core.settings import Settings
from orchestrator.run.schedules import add_task, get_task, list_tasks
from orchestrator.store.db import Database
from orchestrator.store.message_log import get_messages_after
from tests.host.agent_runs import MAIN, TEAM, main_and_team, play


@pytest.fixture(autouse=True)
def groups(db: Database) -> None:
    main_and_team(db)


def run(settings: Settings, db: Database, jid: str, *events: Event) -> None:
    play(settings, db, jid, *events, AssistantEvent(text="ok"))


def host_lines(db: Database, jid: str) -> list[str]:
    return [m.content for m in get_messages_after(jid, 0, db=db) if m.message_type == "host"]


def create(kind: str, spec: str, prompt: str = "$ echo x") -> TaskEvent:
    return TaskEvent(action="create", prompt=prompt, kind=kind, spec=spec)  # type: ignore[arg-type]


def in_s(seconds: float) -> str:
    return (datetime.now(UTC) + timedelta(seconds=seconds)).isoformat()


def test_a_cron_line_with_seconds_is_refused_with_why_and_what_to_use(settings: Settings, db: Database) -> None:
    """What `/schedule cron * * * * * *: $ echo x` asks in the main chat: no task, the reason said."""
    run(settings, db, MAIN, create("cron", "* * * * * *"), create("cron", "0 9 * * 1-5 30"))
    assert list_tasks(db) == []
    for line in host_lines(db, MAIN):
        assert line.startswith("🚫 schedule_task refused: cron line ") and "has a seconds field" in line
        assert "ORCHESTRATOR_AGENT_TASK_MIN_INTERVAL_S" in line and "use five fields" in line
    assert len(host_lines(db, MAIN)) == 2
    # The operator's rules are the operator's: a seconds field is still theirs to use.
    assert add_task(db, chat_jid=TEAM, prompt="p", kind="cron", spec="* * * * * *").made_by_agent is False


@pytest.mark.parametrize(
    ("spec", "refused"),
    [
        ("*/5 * * * *", True),  # every 5 minutes
        ("0,5 9 * * *", True),  # 5 minutes apart once a day
        ("55 23 * * *", False),  # once a day
        ("0,55 0,23 * * *", True),  # 23:55 then 00:00: 5 minutes over midnight
        ("*/10 * * * *", False),
        ("@hourly", False),
    ],
)
def test_a_cron_line_falls_due_no_more_often_than_the_least_interval(
    settings: Settings, db: Database, spec: str, refused: bool
) -> None:
    settings = settings.replace(agent_task_min_interval_s=600)
    run(settings, db, TEAM, create("cron", spec))
    (line,) = host_lines(db, TEAM)
    if refused:
        assert list_tasks(db) == []
        assert line.startswith(f"🚫 schedule_task refused: cron line {spec!r} can fall due 300s apart")
        assert "sooner than every 600s (ORCHESTRATOR_AGENT_TASK_MIN_INTERVAL_S)" in line
    else:
        (task,) = list_tasks(db)
        assert task.spec == spec and task.made_by_agent and line.startswith("🗓 The agent scheduled task")


@pytest.mark.parametrize(
    "spec", ["* * * * *", "*/7 * * * *", "0,5 9 * * *", "0,55 0,23 * * *", "15 */5 * * *", "0 0 29 2 *", "@daily"]
)
def test_the_shortest_cron_gap_is_never_longer_than_a_real_one(spec: str) -> None:
    """A lower bound, and the true gap when every day fires: checked against the cron library's
    own due times over two weeks."""
    from orchestrator.run.schedules import shortest_cron_gap_s

    times = croniter(spec, datetime(2031, 1, 1, tzinfo=UTC))
    due = [times.get_next(datetime)]
    while len(due) < 2 or (due[-1] - due[0] < timedelta(days=14) and len(due) < 2000):
        due.append(times.get_next(datetime))
    real = min((later - earlier).total_seconds() for earlier, later in itertools.pairwise(due))
    bound = shortest_cron_gap_s(spec)
    assert bound <= real
    if spec != "0 0 29 2 *":  # every day fires: the bound is the gap
        assert bound == real
    else:
        assert bound == 86400


def test_a_time_once_is_far_enough_ahead_and_counts_toward_the_cap(settings: Settings, db: Database) -> None:
    settings = settings.replace(agent_task_min_interval_s=600, agent_tasks_max=1)
    # A task whose run schedules the next one a second later would loop as fast as runs go.
    run(settings, db, TEAM, create("once", in_s(5)))
    assert list_tasks(db) == []
    assert "is less than 600s from now (ORCHESTRATOR_AGENT_TASK_MIN_INTERVAL_S)" in host_lines(db, TEAM)[-1]
    run(settings, db, TEAM, create("once", in_s(3600), prompt="later"), create("interval", "1h", prompt="more"))
    assert [t.prompt for t in list_tasks(db)] == ["later"]
    assert "ORCHESTRATOR_AGENT_TASKS_MAX" in host_lines(db, TEAM)[-1]


def test_the_agent_changes_only_the_tasks_it_made(settings: Settings, db: Database) -> None:
    operators = add_task(db, chat_jid=TEAM, prompt="backup", kind="interval", spec="1d")
    ops_paused = add_task(db, chat_jid=TEAM, prompt="report", kind="interval", spec="1d")
    run(settings, db, TEAM, TaskEvent(action="pause", task_id=ops_paused.id))  # refused: stays active
    run(
        settings,
        db,
        TEAM,
        TaskEvent(action="update", task_id=operators.id, prompt="exfiltrate", kind="cron", spec="* * * * *"),
        TaskEvent(action="pause", task_id=operators.id),
        TaskEvent(action="cancel", task_id=operators.id[:8]),
    )
    # Nor the main group's agent, which may manage any group's tasks the agent made.
    run(settings, db, MAIN, TaskEvent(action="cancel", task_id=operators.id))
    kept = get_task(db, operators.id)
    assert (kept.prompt, kept.kind, kept.spec, kept.state, kept.made_by_agent) == (
        "backup",
        "interval",
        "1d",
        "active",
        False,
    )
    assert get_task(db, ops_paused.id).state == "active"
    refusals = host_lines(db, TEAM) + host_lines(db, MAIN)
    assert len(refusals) == 5
    for line in refusals:
        assert line.startswith("🚫 ") and "was made by the operator; the agent changes only the tasks it made" in line
    # Its own it still changes, to a schedule within its limits only.
    run(settings, db, TEAM, create("interval", "1h", prompt="mine"))
    mine = next(t for t in list_tasks(db) if t.prompt == "mine")
    run(settings, db, TEAM, TaskEvent(action="update", task_id=mine.id, kind="cron", spec="* * * * * *"))
    assert get_task(db, mine.id).kind == "interval" and "has a seconds field" in host_lines(db, TEAM)[-1]
    run(settings, db, TEAM, TaskEvent(action="update", task_id=mine.id, kind="cron", spec="0 9 * * *"))
    assert (get_task(db, mine.id).spec, get_task(db, mine.id).made_by_agent) == ("0 9 * * *", True)
