"""The agent schedules a task through a real container (the offline model's ``/schedule``,
the real agent image): the task is the group's, marked as the agent's, listed by the API."""

from __future__ import annotations

from fastapi.testclient import TestClient

from orchestrator.core.settings import Settings
from orchestrator.http.api import create_app
from orchestrator.http.endpoint import CLIENT_HEADER
from orchestrator.root import Orchestrator
from orchestrator.run.ingest import IncomingMessage, ingest
from orchestrator.run.outbound import ChannelRegistry
from orchestrator.run.pipeline import Pipeline
from orchestrator.store.db import Database
from orchestrator.store.groups import ensure_main_group
from orchestrator.store.message_log import get_messages_after

JID = "main@local"


def test_the_agent_schedules_a_task_the_api_lists(settings: Settings, db: Database, agent_image: str) -> None:
    s = settings.replace(agent_image=agent_image, run_timeout_s=30.0, api_allowed_hosts="testserver")
    s.ensure_dirs()
    ensure_main_group(db)
    ingest(db, s, IncomingMessage(chat_jid=JID, sender="u", content="/schedule every 60s: $ echo tick"), signal=None)
    assert [o.run.state for o in Pipeline(s, db, ChannelRegistry([])).drain_group(JID)] == ["succeeded"]
    with TestClient(create_app(Orchestrator(s)), headers={CLIENT_HEADER: "tests"}) as client:
        (task,) = client.get("/api/tasks").json()
    assert (task["chat_jid"], task["kind"], task["spec"], task["prompt"], task["made_by_agent"]) == (
        JID,
        "interval",
        "60s",
        "$ echo tick",
        True,
    )
    said = [m.content for m in get_messages_after(JID, 0, db=db) if m.message_type == "host"]
    assert any(line.startswith(f"🗓 The agent scheduled task {task['id'][:8]}: every 60s") for line in said)
