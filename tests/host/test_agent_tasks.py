"""The agent's schedule tools decided on the host (orchestrator/run/agent_tasks.py), through a
run of the pipeline with the fake sandbox, on both databases: a task made, marked as the
agent's and announced; a group's own tasks only, the main group's any group's; the shortest
interval and the cap; the tool off in the group's profile; a replay makes none."""

from __future__ import annotations

import pytest

from agent_runner.protocol import AssistantEvent, Event, ResultEvent, TaskEvent, Usage
from fakes.clock import FakeClock
from fakes.sandbox import FakeSandbox, Script
from orchestrator.core.settings import Settings
from orchestrator.run.ingest import IncomingMessage, ingest
from orchestrator.run.outbound import ChannelRegistry
from orchestrator.run.pipeline import Pipeline
from orchestrator.run.profile import change_profile
from orchestrator.run.replay import create_replay, execute_replay
from orchestrator.run.schedules import add_task, get_task, list_tasks
from orchestrator.store.db import Database
from orchestrator.store.groups import add_group, ensure_main_group
from orchestrator.store.message_log import get_messages_after

MAIN, TEAM, OPS = "main@local", "team@g.us", "ops@g.us"


@pytest.fixture(autouse=True)
def groups(db: Database) -> None:
    ensure_main_group(db)
    add_group(db, chat_jid=TEAM, name="team", folder="team", requires_trigger=False)
    add_group(db, chat_jid=OPS, name="ops", folder="ops", requires_trigger=False)


def run(settings: Settings, db: Database, jid: str, *events: Event) -> FakeSandbox:
    sandbox = FakeSandbox(Script([*events, AssistantEvent(text="ok"), ResultEvent(usage=Usage())]))
    ingest(db, settings, IncomingMessage(chat_jid=jid, sender="u", content="go"), signal=None)
    Pipeline(settings, db, ChannelRegistry([]), sandbox, clock=FakeClock()).drain_group(jid)
    return sandbox


def host_lines(db: Database, jid: str) -> list[str]:
    return [m.content for m in get_messages_after(jid, 0, db=db) if m.message_type == "host"]


def create(spec: str = "60s", prompt: str = "$ echo tick", **fields: object) -> TaskEvent:
    return TaskEvent(action="create", prompt=prompt, kind="interval", spec=spec, **fields)  # type: ignore[arg-type]


def test_the_agent_schedules_a_task_of_its_group_marked_and_announced(settings: Settings, db: Database) -> None:
    run(settings, db, TEAM, create())
    (task,) = list_tasks(db, chat_jid=TEAM)
    assert (task.prompt, task.kind, task.spec, task.made_by_agent, task.state) == (
        "$ echo tick",
        "interval",
        "60s",
        True,
        "active",
    )
    (said,) = host_lines(db, TEAM)
    assert said.startswith(f"🗓 The agent scheduled task {task.id[:8]}: every 60s, next ") and "$ echo tick" in said
    # The next run is given it, for list_tasks.
    ((_, sent),) = run(settings, db, TEAM).started
    assert [t.id for t in sent.tasks] == [task.id] and sent.tasks[0].made_by_agent  # type: ignore[union-attr]


def test_an_operators_task_is_not_the_agents(db: Database) -> None:
    assert add_task(db, chat_jid=TEAM, prompt="p", kind="interval", spec="1h").made_by_agent is False


@pytest.mark.parametrize(
    ("event", "said"),
    [
        (create(spec="10s"), "shorter than 60s (ORCHESTRATOR_AGENT_TASK_MIN_INTERVAL_S)"),
        (create(chat_jid=OPS), f"a non-main group schedules tasks for its own chat ({TEAM}) only"),
        (TaskEvent(action="create", prompt="p", kind="cron", spec="61 * * * *"), "cron line '61 * * * *' is not valid"),
        (TaskEvent(action="create", prompt="p", kind="once", spec="2001-01-01T00:00Z"), "is in the past"),
    ],
    ids=["too-often", "other-group", "bad-cron", "past"],
)
def test_what_the_host_refuses_is_said_and_nothing_is_made(
    settings: Settings, db: Database, event: TaskEvent, said: str
) -> None:
    run(settings, db, TEAM, event)
    assert list_tasks(db) == []
    (line,) = host_lines(db, TEAM)
    assert line.startswith("🚫 schedule_task refused: ") and said in line


def test_the_main_group_schedules_for_any_group(settings: Settings, db: Database) -> None:
    run(settings, db, MAIN, create(chat_jid=OPS))
    (task,) = list_tasks(db)
    assert task.chat_jid == OPS and task.made_by_agent
    assert f"for {OPS}" in host_lines(db, MAIN)[0]


def test_a_group_changes_its_own_tasks_and_not_anothers(settings: Settings, db: Database) -> None:
    mine = add_task(db, chat_jid=TEAM, prompt="standup", kind="cron", spec="0 9 * * 1-5", made_by_agent=True)
    theirs = add_task(db, chat_jid=OPS, prompt="backup", kind="interval", spec="1d")
    run(
        settings,
        db,
        TEAM,
        TaskEvent(action="pause", task_id=mine.id[:8]),
        TaskEvent(action="update", task_id=mine.id, prompt="retro", kind="interval", spec="2h"),
        TaskEvent(action="cancel", task_id=theirs.id),
    )
    changed = get_task(db, mine.id)
    assert (changed.state, changed.prompt, changed.kind, changed.spec) == ("paused", "retro", "interval", "2h")
    assert get_task(db, theirs.id).state == "active"
    paused, updated, refused = host_lines(db, TEAM)
    assert paused.startswith(f"🗓 The agent paused task {mine.id[:8]}")
    assert updated.startswith(f"🗓 The agent changed task {mine.id[:8]}: every 2h")
    assert refused == f"🚫 cancel_task refused: no scheduled task {theirs.id!r} of this group"


def test_the_cap_of_live_tasks_the_agent_made(settings: Settings, db: Database) -> None:
    settings = settings.replace(agent_tasks_max=2)
    run(settings, db, TEAM, create(prompt="a"), create(prompt="b"), create(prompt="c"))
    assert sorted(t.prompt for t in list_tasks(db, chat_jid=TEAM)) == ["a", "b"]
    assert "ORCHESTRATOR_AGENT_TASKS_MAX" in host_lines(db, TEAM)[-1]
    # An operator's tasks do not count against it; a cancelled one frees its place.
    add_task(db, chat_jid=TEAM, prompt="operator's", kind="interval", spec="1h")
    first = next(t for t in list_tasks(db, chat_jid=TEAM) if t.prompt == "a")
    run(settings, db, TEAM, TaskEvent(action="cancel", task_id=first.id), create(prompt="d"))
    assert sorted(t.prompt for t in list_tasks(db, chat_jid=TEAM) if t.state == "active") == ["b", "d", "operator's"]


def test_without_schedules_in_the_groups_tools_the_host_refuses(settings: Settings, db: Database) -> None:
    change_profile(db, settings, TEAM, {"tools": ["send_message"]}, image_exists=lambda _: True)
    sandbox = run(settings, db, TEAM, create())
    assert list_tasks(db) == []
    assert host_lines(db, TEAM)[-1] == (
        "🚫 schedule_task refused: schedules is not among this group's tools (orchestrator groups set --tools)"
    )
    ((_, sent),) = sandbox.started
    assert sent.tools == ["send_message"] and sent.tasks is not None and not isinstance(sent.tasks, list)


def test_a_replay_schedules_nothing(settings: Settings, db: Database) -> None:
    settings = settings.replace(max_attempts=1)
    sandbox = run(settings, db, TEAM, create())
    assert len(list_tasks(db)) == 1
    original = sandbox.started[0][0].run_id
    execute_replay(db, settings, sandbox, create_replay(db, settings, original, "offline").id)
    assert len(list_tasks(db)) == 1
