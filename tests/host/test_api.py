"""The HTTP API over a real database: status codes, field-naming 400s, history changes."""

from __future__ import annotations

import json
from collections.abc import Iterator

import pytest
from fastapi.testclient import TestClient

from orchestrator.core.settings import Settings
from orchestrator.http.api import MAX_CONTENT_CHARS, create_app
from orchestrator.http.endpoint import CLIENT_HEADER
from orchestrator.model.views import REPLY_TO_KEY
from orchestrator.root import Orchestrator
from orchestrator.run.assembly import record_input
from orchestrator.store import leases
from orchestrator.store.db import Database
from orchestrator.store.groups import add_group
from orchestrator.store.message_log import get_messages_after, store_message_direct
from orchestrator.store.runs import create_run

JID = "web@local"


@pytest.fixture
def client(db: Database, settings: Settings) -> Iterator[TestClient]:
    add_group(db, chat_jid=JID, name="Web", folder="web", requires_trigger=True)
    # CLIENT_HEADER: what this API's clients send with a change while no token is set.
    with TestClient(create_app(Orchestrator(settings)), headers={CLIENT_HEADER: "tests"}) as c:
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
        (
            {"message_type": "CODE_EDIT", "payload": {"edits": [{"file_path": ""}]}},
            "metadata.payload.edits[0].file_path",
        ),
        ({"message_type": "TOOL_CALL", "version": 0, "payload": {"tool_name": "x"}}, "metadata.version"),
        ({"context": [{"type": "url", "url": "gopher://x"}]}, "metadata.context[0].url"),
    ],
)
def test_invalid_metadata_is_a_400_naming_the_field(
    client: TestClient, db: Database, metadata: object, field: str
) -> None:
    r = _post(client, content="x", metadata=metadata)
    assert r.status_code == 400, r.text
    assert r.json()["field"] == field
    assert get_messages_after(JID, 0, db=db) == []


def test_structured_message_gets_a_preview_and_keeps_extras(client: TestClient) -> None:
    meta = {
        "message_type": "TODO",
        "payload": {"todos": [{"id": "1", "content": "ship", "status": "completed"}]},
        "webhook_url": "https://example.com/hook",
    }
    r = _post(client, content="", metadata=meta)
    assert r.status_code == 201, r.text
    msg = r.json()["message"]
    assert msg["content"] == "Todos 1/1 done"
    assert msg["metadata"] == {
        "message_type": "TODO",
        "version": 1,
        "payload": meta["payload"],
        "webhook_url": "https://example.com/hook",
    }


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
        db=db,
        id="a1",
        chat_jid=JID,
        sender="bot",
        sender_name="Andy",
        content="answer",
        timestamp="2026-11-26T12:00:00+00:00",
        is_from_me=True,
        message_type="assistant",
        metadata={REPLY_TO_KEY: u["seq"], "run_id": run.id},
    )
    r = client.post(f"/api/chats/{JID}/messages/q1/edit", json={"content": "@Andy first, edited"})
    assert r.status_code == 200 and r.json()["message"]["content"] == "@Andy first, edited"
    bad = client.post(f"/api/chats/{JID}/messages/q1/edit", json={"content": "x", "context": [{"type": "nope"}]})
    assert bad.status_code == 400 and bad.json()["field"] == "metadata.context[0].type"
    assert client.post(f"/api/chats/{JID}/messages/zz/edit", json={"content": "x"}).status_code == 404
    # Not a reply: a well-formed request the message's state refuses (409, as documented), not bad input.
    not_a_reply = client.post(f"/api/chats/{JID}/messages/q1/regenerate")
    assert not_a_reply.status_code == 409 and "only an assistant reply" in not_a_reply.json()["detail"]

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


# -- bearer token ----------------------------------------------------------------

TOKEN = "s3cret-token-for-tests"


@pytest.fixture
def secured(db: Database, settings: Settings) -> Iterator[TestClient]:
    add_group(db, chat_jid=JID, name="Web", folder="web", requires_trigger=True)
    with TestClient(create_app(Orchestrator(settings.replace(**{"api_token": TOKEN})))) as c:
        yield c


def test_token_is_required_on_every_api_route(secured: TestClient) -> None:
    paths = {p: ops for p, ops in secured.get("/openapi.json").json()["paths"].items() if p.startswith("/api/")}
    assert len(paths) >= 13
    for template, ops in paths.items():
        path = template.replace("{chat_jid}", JID).replace("{message_id}", "m").replace("{run_id}", "r")
        for method in ops:
            for headers in (
                {},
                {"Authorization": "Bearer wrong"},
                {"Authorization": f"Basic {TOKEN}"},
                {"Authorization": f"Bearer {TOKEN}x"},
            ):
                r = secured.request(method, path, headers=headers)
                assert r.status_code == 401, (method, path, headers, r.text)
                assert r.headers["www-authenticate"] == "Bearer"
    ok = {"Authorization": f"Bearer {TOKEN}"}
    assert secured.get("/api/groups", headers=ok).status_code == 200
    assert secured.get("/api/info", headers=ok).json()["token_required"] is True
    r = secured.post("/api/messages", headers=ok, json={"chat_jid": JID, "sender": "u", "content": "hi"})
    assert r.status_code == 201
    # No data there: health, the page and its files stay open.
    assert secured.get("/health").status_code == 200
    assert secured.get("/").status_code == 200
    assert secured.get("/static/app.js").status_code == 200


def test_openapi_declares_the_bearer_scheme(client: TestClient) -> None:
    schema = client.get("/openapi.json").json()
    assert any(s.get("scheme") == "bearer" for s in schema["components"]["securitySchemes"].values())
    assert {"/api/groups", "/api/groups/{chat_jid}", "/api/chats/{chat_jid}/stream"} <= set(schema["paths"])
    assert set(schema["paths"]["/api/groups/{chat_jid}"]) == {"get", "patch"}


def test_no_token_refused_beyond_loopback(settings: Settings) -> None:
    from orchestrator.core.errors import ConfigError
    from orchestrator.http.api import check_exposure, is_loopback

    assert all(is_loopback(h) for h in ("127.0.0.1", "127.0.0.2", "::1", "[::1]", "localhost"))
    assert not any(is_loopback(h) for h in ("0.0.0.0", "::", "", "192.168.1.5", "example.com", "myhost"))
    check_exposure("127.0.0.1", "")
    check_exposure("0.0.0.0", "t")
    with pytest.raises(ConfigError, match="ORCHESTRATOR_API_TOKEN"):
        check_exposure("0.0.0.0", "")
    with pytest.raises(ConfigError, match="without a token"):
        create_app(Orchestrator(settings.replace(**{"api_host": "0.0.0.0"})))
    create_app(Orchestrator(settings.replace(**{"api_host": "0.0.0.0", "api_token": TOKEN})))


def test_cli_refuses_to_serve_beyond_loopback_without_a_token(settings: Settings) -> None:
    import os
    import subprocess
    import sys
    from pathlib import Path

    from tests.conftest import TEST_ENV

    env = {k: v for k, v in os.environ.items() if not k.startswith("ORCHESTRATOR_")} | TEST_ENV
    env["ORCHESTRATOR_DATA_DIR"] = str(settings.data_dir)
    cli = str(Path(sys.executable).parent / "orchestrator")
    for argv in (["api", "--host", "0.0.0.0", "--port", "1"], ["up", "--host", "::", "--port", "1"]):
        done = subprocess.run([cli, *argv], env=env, capture_output=True, text=True, timeout=60)
        assert done.returncode == 1, done.stdout + done.stderr
        assert "refusing to serve the HTTP API on" in done.stderr and "ORCHESTRATOR_API_TOKEN" in done.stderr


# -- registration required ----------------------------------------------------------


def test_unknown_chat_is_a_404_unless_allowed(client: TestClient, db: Database, settings: Settings) -> None:
    r = client.post("/api/messages", json={"chat_jid": "nobody@local", "sender": "u", "content": "hi"})
    assert r.status_code == 404 and "POST /api/groups" in r.json()["detail"]
    assert client.get("/api/chats/nobody@local/stream").status_code == 404
    assert get_messages_after("nobody@local", 0, db=db) == []
    # Bad input is still a 400 / 413 first, whatever the chat.
    bad = client.post("/api/messages", json={"chat_jid": "nobody@local", "content": "x"})
    assert bad.status_code == 400 and bad.json()["field"] == "sender"
    big = client.post(
        "/api/messages", json={"chat_jid": "nobody@local", "sender": "u", "content": "x" * (MAX_CONTENT_CHARS + 1)}
    )
    assert big.status_code == 413

    with TestClient(
        create_app(Orchestrator(settings.replace(**{"api_require_registered_chat": False}))),
        headers={CLIENT_HEADER: "tests"},
    ) as open_api:
        r = open_api.post("/api/messages", json={"chat_jid": "nobody@local", "sender": "u", "content": "hi"})
        assert r.status_code == 201 and not r.json()["triggered"]
        assert open_api.get("/api/info").json()["require_registered_chat"] is False


# -- groups -----------------------------------------------------------------------


def test_register_list_and_change_groups(client: TestClient, db: Database) -> None:
    body = {"chat_jid": "team@g.us", "name": "Team", "folder": "team"}
    r = client.post("/api/groups", json=body)
    assert r.status_code == 201, r.text
    g = r.json()
    assert (g["chat_jid"], g["name"], g["folder"], g["requires_trigger"], g["is_main"]) == (
        "team@g.us",
        "Team",
        "team",
        True,
        False,
    )
    assert [x["chat_jid"] for x in client.get("/api/groups").json()] == ["team@g.us", JID]
    assert client.post("/api/groups", json=body).status_code == 409  # same chat
    assert client.post("/api/groups", json={**body, "chat_jid": "other@g.us"}).status_code == 409  # same folder

    for bad, field in [
        ({**body, "folder": "../etc"}, "folder"),
        ({**body, "folder": ""}, "folder"),
        ({"chat_jid": "x@g.us", "folder": "x"}, "name"),
        ({**body, "chat_jid": "has space"}, "chat_jid"),
        ({**body, "chat_jid": "y@g.us", "folder": "y", "assistant_name": "@Bob"}, "assistant_name"),
        ({**body, "chat_jid": "z@g.us", "folder": "z", "is_main": "sometimes"}, "is_main"),
        ({**body, "chat_jid": "w@g.us", "folder": "w", "main": True}, "main"),  # unknown fields refused
    ]:
        r = client.post("/api/groups", json=bad)
        assert r.status_code == 400 and r.json()["field"] == field, (bad, r.text)

    r = client.patch(
        "/api/groups/team@g.us", json={"name": "The team", "requires_trigger": False, "assistant_name": "Bob"}
    )
    assert r.status_code == 200, r.text
    assert (r.json()["name"], r.json()["requires_trigger"], r.json()["assistant_name"]) == ("The team", False, "Bob")
    r = client.patch("/api/groups/team@g.us", json={"assistant_name": None})
    assert r.status_code == 200 and r.json()["assistant_name"] is None and r.json()["name"] == "The team"
    assert client.patch("/api/groups/team@g.us", json={}).json()["name"] == "The team"
    assert client.patch("/api/groups/nobody@g.us", json={"name": "x"}).status_code == 404
    for bad, field in [
        ({"name": None}, "name"),
        ({"name": ""}, "name"),
        ({"requires_trigger": None}, "requires_trigger"),
        ({"folder": "other"}, "folder"),
        ({"assistant_name": "two words"}, "assistant_name"),
    ]:
        r = client.patch("/api/groups/team@g.us", json=bad)
        assert r.status_code == 400 and r.json()["field"] == field, (bad, r.text)

    # The sandbox, checked by orchestrator/sandbox/config.py like the CLI's.
    r = client.patch("/api/groups/team@g.us", json={"container_config": {"memory": "256m", "pids": 64}})
    assert r.status_code == 200 and r.json()["container_config"] == {"memory": "256m", "pids": 64}
    for bad in (
        {"network": "bridge"},
        {"privileged": True},
        {"run_timeout_s": 10**6},
        {"extra_mounts": [{"host_path": "/etc", "name": "etc"}]},
    ):
        r = client.patch("/api/groups/team@g.us", json={"container_config": bad, "name": "not applied"})
        assert r.status_code == 400 and r.json()["field"].startswith("container_config"), (bad, r.text)
    assert client.get("/api/groups/team@g.us").json()["name"] == "The team"
    r = client.patch("/api/groups/team@g.us", json={"container_config": None})
    assert r.status_code == 200 and r.json()["container_config"] is None


def test_a_registered_group_wakes_the_agent(client: TestClient) -> None:
    client.post(
        "/api/groups", json={"chat_jid": "solo@local", "name": "Solo", "folder": "solo", "requires_trigger": False}
    )
    r = client.post("/api/messages", json={"chat_jid": "solo@local", "sender": "u", "content": "no trigger needed"})
    assert r.status_code == 201 and r.json()["triggered"]
    info = client.get("/api/info").json()
    assert info == {
        "assistant_name": "Andy",
        "trigger_names": ["Andy"],
        "require_registered_chat": True,
        "token_required": False,
        "file_max_bytes": 25 * 1024 * 1024,
    }


def test_the_page_is_served_with_a_strict_policy(client: TestClient) -> None:
    page = client.get("/")
    assert page.status_code == 200 and page.headers["content-type"].startswith("text/html")
    assert "script-src 'self'" in page.headers["content-security-policy"]
    assert '<script src="static/app.js"' in page.text and "http" not in page.text.replace("http-equiv", "")
    scripts = ("dom.js", "app.js", "questions.js", "profile.js", "egress.js", "reactions.js")
    for name, kind in (*((s, "javascript") for s in scripts), ("style.css", "text/css")):
        r = client.get(f"/static/{name}")
        assert r.status_code == 200 and kind in r.headers["content-type"]
        assert r.headers["x-content-type-options"] == "nosniff"
    for name in scripts:
        assert f'<script src="static/{name}"' in page.text
        assert ".innerHTML" not in client.get(f"/static/{name}").text  # every text goes in as text
    assert client.get("/static/nope.js").status_code == 404


def test_query_numbers_past_what_the_database_holds_are_refused(client: TestClient) -> None:
    # Found by schemathesis: a seq past BIGINT made SQLite raise OverflowError (a 500).
    _post(client, content="hi", id="q1")
    huge = 394597466618516761105144022564864
    for path in (
        f"/api/chats/{JID}/messages?after={huge}",
        f"/api/chats/{JID}/messages?after={2**31}",
        f"/api/hosts?window_s={10.0**300}",
    ):
        r = client.get(path)
        assert r.status_code == 400, (path, r.status_code, r.text)
    assert client.get(f"/api/chats/{JID}/messages?after={2**31 - 1}").json() == []


def test_history_changes_in_a_chat_that_does_not_exist_are_404(client: TestClient) -> None:
    for action in ("edit", "regenerate", "truncate"):
        r = client.post(f"/api/chats/nobody@nowhere/messages/m1/{action}", json={"content": "x"})
        assert r.status_code == 404 and "nobody@nowhere" in r.text, (action, r.status_code, r.text)
