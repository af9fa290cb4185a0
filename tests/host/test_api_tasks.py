"""Scheduled tasks over HTTP (``/api/tasks``) and a group's profile (``GET /api/groups/{chat_jid}``,
``orchestrator groups show``), on both databases."""

from __future__ import annotations

import json
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta

import pytest
from fastapi.testclient import TestClient

from orchestrator.core.settings import Settings
from orchestrator.http.api import create_app
from orchestrator.http.endpoint import CLIENT_HEADER
from orchestrator.root import Orchestrator
from orchestrator.store.db import Database
from orchestrator.store.groups import add_group, update_group
from orchestrator.store.schedules import insert_task

JID = "team@local"


@pytest.fixture
def client(db: Database, settings: Settings) -> Iterator[TestClient]:
    add_group(db, chat_jid=JID, name="Team", folder="team")
    with TestClient(create_app(Orchestrator(settings)), headers={CLIENT_HEADER: "tests"}) as c:
        yield c


def _create(client: TestClient, **body: object) -> object:
    return client.post("/api/tasks", json={"chat_jid": JID, "prompt": "check the build", **body})


def test_create_list_read_pause_resume_cancel(client: TestClient) -> None:
    before = datetime.now(UTC)
    r = _create(client, kind="interval", spec="30m")
    assert r.status_code == 201, r.text
    task = r.json()
    assert (task["chat_jid"], task["kind"], task["spec"], task["state"]) == (JID, "interval", "30m", "active")
    assert task["context_mode"] == "group" and task["runs"] == 0
    due = datetime.fromisoformat(task["next_run_at"])
    assert before + timedelta(minutes=30) <= due <= datetime.now(UTC) + timedelta(minutes=30)
    cron = _create(client, kind="cron", spec="0 9 * * 1-5", context_mode="isolated").json()
    once = _create(client, kind="once", spec=(datetime.now(UTC) + timedelta(days=1)).isoformat()).json()
    assert cron["context_mode"] == "isolated" and once["kind"] == "once"

    listed = client.get("/api/tasks")
    assert listed.status_code == 200 and [t["id"] for t in listed.json()] == [task["id"], cron["id"], once["id"]]
    assert len(client.get("/api/tasks", params={"chat_jid": JID}).json()) == 3
    assert client.get("/api/tasks", params={"chat_jid": "other@local"}).json() == []
    assert client.get(f"/api/tasks/{task['id']}").json() == task
    assert client.get(f"/api/tasks/{task['id'][:8]}").json()["id"] == task["id"]  # a unique prefix, as the CLI

    paused = client.post(f"/api/tasks/{task['id'][:8]}/pause")
    assert paused.status_code == 200 and paused.json()["state"] == "paused"
    again = client.post(f"/api/tasks/{task['id']}/pause")
    assert again.status_code == 409 and "is paused; cannot pause" in again.json()["detail"]
    resumed = client.post(f"/api/tasks/{task['id']}/resume")
    assert resumed.status_code == 200 and resumed.json()["state"] == "active"
    assert client.post(f"/api/tasks/{task['id']}/resume").status_code == 409
    cancelled = client.post(f"/api/tasks/{task['id']}/cancel")
    assert cancelled.status_code == 200 and cancelled.json()["state"] == "cancelled"
    assert client.post(f"/api/tasks/{task['id']}/cancel").status_code == 409
    assert client.get(f"/api/tasks/{task['id']}").json()["state"] == "cancelled"


@pytest.mark.parametrize(
    ("kind", "spec", "needle"),
    [
        ("cron", "61 * * * *", "cron line"),
        ("cron", "every day", "cron line"),
        ("cron", "0 0 31 2 *", "never falls due"),
        ("interval", "soon", "interval"),
        ("interval", "0.5s", "shorter than one second"),
        ("interval", "99999999999d", "longer than a year"),
        ("once", "tomorrow", "ISO-8601"),
        ("once", "2020-01-01T00:00:00", "in the past"),
        ("once", "9999-12-31T23:59:59-14:00", "out of range"),
    ],
)
def test_a_bad_schedule_is_a_400_naming_spec(client: TestClient, kind: str, spec: str, needle: str) -> None:
    r = _create(client, kind=kind, spec=spec)
    assert r.status_code == 400, r.text
    assert r.json()["field"] == "spec" and needle in r.json()["detail"], r.json()
    assert client.get("/api/tasks").json() == []


def test_other_bad_bodies_name_their_field(client: TestClient) -> None:
    for body, field in [
        ({"kind": "weekly", "spec": "1h"}, "kind"),
        ({"kind": "interval", "spec": "1h", "prompt": " \t\u3000"}, "prompt"),
        ({"kind": "interval", "spec": "1h", "context_mode": "shared"}, "context_mode"),
        ({"kind": "interval", "spec": "1h\x00"}, "spec"),
        ({"kind": "interval"}, "spec"),
    ]:
        r = _create(client, **body)
        assert r.status_code == 400 and r.json()["field"] == field, (body, r.text)


def test_unknown_tasks_and_chats_are_404s(client: TestClient, db: Database) -> None:
    r = _create(client, chat_jid="stranger@local", kind="interval", spec="1h")
    assert r.status_code == 404 and "stranger@local" in r.json()["detail"]
    for path in ("/api/tasks/nope", "/api/tasks/nope/pause", "/api/tasks/nope/resume", "/api/tasks/nope/cancel"):
        r = client.get(path) if path.endswith("nope") else client.post(path)
        assert r.status_code == 404 and "no scheduled task 'nope'" in r.json()["detail"], (path, r.text)
    at = datetime.now(UTC)
    for task_id in ("ab-1", "ab-2"):
        insert_task(
            db,
            task_id=task_id,
            chat_jid=JID,
            prompt="p",
            kind="interval",
            spec="1h",
            context_mode="group",
            next_run_at=at,
            created_at=at,
        )
    ambiguous = client.get("/api/tasks/ab")
    assert ambiguous.status_code == 404 and "ambiguous" in ambiguous.json()["detail"]
    # A prefix is taken as it is: "%" and "_" match no id, not every id (LIKE's wildcards).
    assert client.get("/api/tasks/ab-1").status_code == 200
    assert client.get("/api/tasks/ab_1").status_code == 404
    assert client.get("/api/tasks/%25").status_code == 404


def test_a_groups_profile_counts_its_tasks(client: TestClient, db: Database) -> None:
    empty = client.get(f"/api/groups/{JID}")
    assert empty.status_code == 200, empty.text
    assert empty.json()["tasks"] == {"active": 0, "paused": 0, "done": 0, "cancelled": 0}
    ids = [_create(client, kind="interval", spec=f"{n}h").json()["id"] for n in (1, 2, 3)]
    client.post(f"/api/tasks/{ids[0]}/pause")
    client.post(f"/api/tasks/{ids[1]}/cancel")
    client.patch(f"/api/groups/{JID}", json={"container_config": {"pids": 64}, "runs_per_hour": 5})
    profile = client.get(f"/api/groups/{JID}").json()
    assert profile["tasks"] == {"active": 1, "paused": 1, "done": 0, "cancelled": 1}
    assert (profile["chat_jid"], profile["folder"], profile["requires_trigger"]) == (JID, "team", True)
    assert profile["container_config"] == {"pids": 64}
    assert (profile["runs_per_hour"], profile["tokens_per_day"]) == (5, None)
    # Another group's tasks are not counted.
    add_group(db, chat_jid="other@local", name="Other", folder="other")
    assert client.get("/api/groups/other@local").json()["tasks"]["paused"] == 0
    assert client.get("/api/groups/nobody@local").status_code == 404


def test_groups_show_prints_the_profile(db: Database, settings: Settings) -> None:
    from typer.testing import CliRunner

    from orchestrator.cli.main import app
    from orchestrator.run.schedules import add_task, change_state

    add_group(db, chat_jid=JID, name="Team", folder="team")
    update_group(db, JID, {"tokens_per_day": 1000, "assistant_name": "Bee"})
    paused = add_task(db, chat_jid=JID, prompt="p", kind="interval", spec="1h")
    change_state(db, paused.id, "pause")
    add_task(db, chat_jid=JID, prompt="q", kind="cron", spec="0 9 * * *")
    env = {
        "ORCHESTRATOR_DATA_DIR": str(settings.data_dir),
        "ORCHESTRATOR_DATABASE_URL": settings.effective_database_url,
    }
    shown = CliRunner().invoke(app, ["groups", "show", JID], env=env)
    assert shown.exit_code == 0, shown.output
    lines = shown.output.splitlines()
    assert lines[0] == f"{JID}: Team"
    # Its own assistant name, and the installation's names: it has no trigger names of its own.
    assert "  wakes on:    messages starting with @Bee or @Andy" in lines
    assert "  tokens/day:  1,000" in lines
    assert "  tasks:       1 active, 1 paused, 0 done, 0 cancelled" in lines
    as_json = CliRunner().invoke(app, ["groups", "show", JID, "--json"], env=env)
    assert as_json.exit_code == 0, as_json.output
    profile = json.loads(as_json.output)
    assert profile["tasks"] == {"active": 1, "paused": 1, "done": 0, "cancelled": 0}
    assert (profile["assistant_name"], profile["tokens_per_day"], profile["folder"]) == ("Bee", 1000, "team")
    # The API answers the same for the group.
    with TestClient(create_app(Orchestrator(settings))) as c:
        assert c.get(f"/api/groups/{JID}").json() == profile
    missing = CliRunner().invoke(app, ["groups", "show", "nobody@local"], env=env)
    assert missing.exit_code == 1 and "no registered group for chat 'nobody@local'" in missing.output
