"""The HTTP API over a real database: status codes, field-naming 400s, history changes."""

from __future__ import annotations

import json
from collections.abc import Iterator

import pytest
from fastapi.testclient import TestClient

from orchestrator import leases
from orchestrator.api import MAX_CONTENT_CHARS, create_app
from orchestrator.assembly import record_input
from orchestrator.db import Database
from orchestrator.groups import add_group
from orchestrator.runs import create_run
from orchestrator.settings import Settings
from orchestrator.store import get_messages_after, store_message_direct
from orchestrator.views import REPLY_TO_KEY

JID = "web@local"


@pytest.fixture
def client(db: Database, settings: Settings) -> Iterator[TestClient]:
    add_group(db, chat_jid=JID, name="Web", folder="web", requires_trigger=True)
    with TestClient(create_app(settings)) as c:
        yield c


def _post(client: TestClient, **body: object) -> object:
    return client.post("/api/messages", json={"chat_jid": JID, "sender": "u1", "sender_name": "Ann", **body})


def test_post_stores_and_returns_201(client: TestClient, db: Database) -> None:
    r = _post(client, content="hello there", id="m-1")
    assert r.status_code == 201, r.text
    body = r.json()
    assert body["created"] and not body["triggered"]  # no @trigger
    assert body["message"]["content"] == "hello there" and body["message"]["seq"] >= 1
    again = _post(client, content="hello there", id="m-1")
    assert again.status_code == 201 and not again.json()["created"]
    assert [m.id for m in get_messages_after(JID, 0, db=db)] == ["m-1"]


@pytest.mark.parametrize(
    ("metadata", "field"),
    [
        ([1, 2], "metadata"),
        ({"message_type": "TODO", "payload": {"todos": []}}, "metadata.payload.todos"),
        ({"message_type": "CODE_EDIT", "payload": {"edits": [{"file_path": ""}]}}, "metadata.payload.edits[0].file_path"),
        ({"message_type": "TOOL_CALL", "version": 0, "payload": {"tool_name": "x"}}, "metadata.version"),
        ({"context": [{"type": "url", "url": "gopher://x"}]}, "metadata.context[0].url"),
    ],
)
def test_invalid_metadata_is_a_400_naming_the_field(client: TestClient, db: Database, metadata: object, field: str) -> None:
    r = _post(client, content="x", metadata=metadata)
    assert r.status_code == 400, r.text
    assert r.json()["field"] == field
    assert get_messages_after(JID, 0, db=db) == []


def test_structured_message_gets_a_preview_and_keeps_extras(client: TestClient) -> None:
    meta = {"message_type": "TODO", "payload": {"todos": [{"id": "1", "content": "ship", "status": "completed"}]},
            "webhook_url": "https://example.com/hook"}
    r = _post(client, content="", metadata=meta)
    assert r.status_code == 201, r.text
    msg = r.json()["message"]
    assert msg["content"] == "Todos 1/1 done"
    assert msg["metadata"] == {"message_type": "TODO", "version": 1, "payload": meta["payload"],
                               "webhook_url": "https://example.com/hook"}


def test_other_bad_input(client: TestClient) -> None:
    assert _post(client, content="x" * (MAX_CONTENT_CHARS + 1)).status_code == 413
    missing = client.post("/api/messages", json={"chat_jid": JID, "content": "x"})
    assert missing.status_code == 400 and missing.json()["field"] == "sender"
    assert _post(client, content="x", timestamp="yesterday").status_code == 400
    assert client.get("/api/groups/nobody@local").status_code == 404
    assert client.get("/api/runs/no-such-run").status_code == 404


def test_edit_regenerate_truncate_over_http(client: TestClient, db: Database, settings: Settings) -> None:
    u = _post(client, content="@Andy first", id="q1").json()["message"]
    run = create_run(db, chat_jid=JID, cursor_from=u["seq"] - 1, cursor_to=u["seq"], celery_task_id=None)
    reply = store_message_direct(
        db=db, id="a1", chat_jid=JID, sender="bot", sender_name="Andy", content="answer",
        timestamp="2026-11-26T12:00:00+00:00", is_from_me=True, message_type="assistant",
        metadata={REPLY_TO_KEY: u["seq"], "run_id": run.id},
    )
    r = client.post(f"/api/chats/{JID}/messages/q1/edit", json={"content": "@Andy first, edited"})
    assert r.status_code == 200 and r.json()["message"]["content"] == "@Andy first, edited"
    bad = client.post(f"/api/chats/{JID}/messages/q1/edit", json={"content": "x", "context": [{"type": "nope"}]})
    assert bad.status_code == 400 and bad.json()["field"] == "metadata.context[0].type"
    assert client.post(f"/api/chats/{JID}/messages/zz/edit", json={"content": "x"}).status_code == 404
    assert client.post(f"/api/chats/{JID}/messages/q1/regenerate").status_code == 400  # not a reply

    assert leases.acquire(db, JID, "someone", 60)
    assert client.post(f"/api/chats/{JID}/messages/{reply.id}/regenerate").status_code == 409
    leases.release(db, JID, "someone")
    r = client.post(f"/api/chats/{JID}/messages/{reply.id}/regenerate")
    assert r.status_code == 200 and r.json()["superseded"] == [reply.seq] and r.json()["rerun"]

    listed = client.get(f"/api/chats/{JID}/messages").json()
    assert [m["id"] for m in listed] == ["q1"]
    audit = client.get(f"/api/chats/{JID}/messages", params={"include_superseded": True}).json()
    assert [m["id"] for m in audit] == ["q1", "a1"] and audit[1]["superseded_at"]

    _post(client, content="more", id="q2")
    r = client.post(f"/api/chats/{JID}/messages/q1/truncate")
    assert r.status_code == 200 and len(r.json()["superseded"]) == 1


def test_run_input_and_export(client: TestClient, db: Database) -> None:
    u = _post(client, content="hi", id="q1").json()["message"]
    run = create_run(db, chat_jid=JID, cursor_from=0, cursor_to=u["seq"], celery_task_id=None)
    assert client.get(f"/api/runs/{run.id}/input").status_code == 404  # none recorded yet
    record_input(db, run.id, b'{"exact": "bytes"}')
    r = client.get(f"/api/runs/{run.id[:8]}/input")
    assert r.status_code == 200 and r.content == b'{"exact": "bytes"}'
    assert client.get(f"/api/runs/{run.id}").json()["input_sha256"] is not None
    exported = client.get(f"/api/chats/{JID}/export")
    assert exported.status_code == 200 and json.loads(exported.content)["messages"][0]["id"] == "q1"
    md = client.get(f"/api/chats/{JID}/export", params={"format": "md"})
    assert md.status_code == 200 and md.text.startswith("# Web")
    assert client.get(f"/api/chats/{JID}/export", params={"format": "pdf"}).status_code == 400
