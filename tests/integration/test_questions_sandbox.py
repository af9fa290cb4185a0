"""The agent asks its group through a real container (the offline model's ``/ask``, the real
agent image): the run ends awaiting the answer, the API lists the open question and takes
the answer as the operator, and the next run's recorded input holds the ``ask_user`` call
answered with it (the issue's check, with the API in place of the command line)."""

from __future__ import annotations

from fastapi.testclient import TestClient

from agent_runner.protocol import decode_input
from orchestrator.core.settings import Settings
from orchestrator.http.api import create_app
from orchestrator.http.endpoint import CLIENT_HEADER
from orchestrator.root import Orchestrator
from orchestrator.run.assembly import stored_input
from orchestrator.run.ingest import IncomingMessage, ingest
from orchestrator.run.outbound import ChannelRegistry
from orchestrator.run.pipeline import Pipeline
from orchestrator.store.db import Database
from orchestrator.store.groups import ensure_main_group

JID = "main@local"


def test_a_question_asked_in_a_container_is_answered_through_the_api(
    settings: Settings, db: Database, agent_image: str
) -> None:
    s = settings.replace(agent_image=agent_image, run_timeout_s=30.0, api_allowed_hosts="testserver")
    s.ensure_dirs()
    ensure_main_group(db)
    ingest(db, s, IncomingMessage(chat_jid=JID, sender="u", content="/ask Which colour? | red | blue"), signal=None)
    (asked,) = Pipeline(s, db, ChannelRegistry([])).drain_group(JID)
    assert asked.run.state == "awaiting_answer"
    with TestClient(create_app(Orchestrator(s)), headers={CLIENT_HEADER: "tests"}) as client:
        (question,) = client.get(f"/api/chats/{JID}/questions", params={"open": "true"}).json()
        assert (question["question"], question["options"], question["state"]) == (
            "Which colour?",
            ["red", "blue"],
            "open",
        )
        wrong = client.post(f"/api/chats/{JID}/questions/{question['id']}/answer", json={"option": "green"})
        assert wrong.status_code == 400 and wrong.json()["field"] == "option"
        done = client.post(f"/api/chats/{JID}/questions/{question['id']}/answer", json={"option": "2"})
        assert done.status_code == 200, done.text
        assert done.json()["state"] == "answered" and done.json()["answer"]["options"] == ["blue"]
        again = client.post(f"/api/chats/{JID}/questions/{question['id']}/answer", json={"option": "red"})
        assert again.status_code == 409 and "answered already" in again.json()["detail"]
    (answered,) = Pipeline(s, db, ChannelRegistry([])).drain_group(JID)
    assert answered.run.state == "succeeded"
    raw = stored_input(db, answered.run.id)
    assert raw is not None
    sent = decode_input(raw).messages
    (call,) = [m for m in sent if m.tool_use and m.tool_use.name == "ask_user"]  # type: ignore[union-attr]
    (result,) = [m for m in sent if m.tool_use_id == call.tool_use.id]  # type: ignore[union-attr]
    assert result.role == "tool_result" and "The group answered: blue" in result.content
