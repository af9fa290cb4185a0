"""What the API's fast path must keep (orchestrator/http/api.py; docs/performance.md, "The HTTP path").

``/health`` and the registration check run on the driver outside any
transaction, and posted messages are written by one thread at a time on
SQLite: none of it may change what is stored or answered.  Real database,
both backends; no speed is asserted.
"""

from __future__ import annotations

import sqlite3
import threading
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor

import pytest
from fastapi.testclient import TestClient

from orchestrator.core.settings import Settings
from orchestrator.http.api import create_app
from orchestrator.http.endpoint import CLIENT_HEADER
from orchestrator.root import Orchestrator
from orchestrator.store.db import Database
from orchestrator.store.groups import add_group, is_registered
from orchestrator.store.message_log import get_messages_after

JID = "fast@local"


@pytest.fixture
def client(db: Database, settings: Settings) -> Iterator[TestClient]:
    add_group(db, chat_jid=JID, name="Fast", folder="fast", requires_trigger=True)
    with TestClient(create_app(Orchestrator(settings)), headers={CLIENT_HEADER: "tests"}) as c:
        yield c


def test_concurrent_posts_are_each_stored_once_in_seq_order(client: TestClient, db: Database) -> None:
    def post(i: int) -> tuple[int, dict[str, object]]:
        r = client.post(
            "/api/messages", json={"chat_jid": JID, "sender": f"u{i % 4}", "content": f"m{i}", "id": f"m{i}"}
        )
        return r.status_code, r.json()

    with ThreadPoolExecutor(16) as pool:
        answers = list(pool.map(post, range(64)))
        again = list(pool.map(post, range(8)))  # the same ids: duplicates, answered with the first copy
    assert {status for status, _ in answers} == {201}
    seqs = sorted(body["message"]["seq"] for _, body in answers)
    assert seqs == list(range(seqs[0], seqs[0] + 64))
    assert all(not body["created"] for _, body in again)
    assert [body["message"]["seq"] for _, body in again] == [
        next(b["message"]["seq"] for _, b in answers if b["message"]["id"] == f"m{i}") for i in range(8)
    ]
    stored = get_messages_after(JID, 0, db=db)
    assert sorted(m.id for m in stored) == sorted(f"m{i}" for i in range(64))


def test_registration_check_and_its_404(client: TestClient, db: Database) -> None:
    assert is_registered(db, JID)
    assert not is_registered(db, "nobody@local")
    assert not is_registered(db, "' OR 1=1 --")  # a parameter, never SQL
    r = client.post("/api/messages", json={"chat_jid": "nobody@local", "sender": "u", "content": "x"})
    assert r.status_code == 404 and "no registered group" in r.json()["detail"]
    assert get_messages_after("nobody@local", 0, db=db) == []


@pytest.mark.parametrize("db_backend", ["sqlite"])  # SQLite's own write lock: no PostgreSQL twin
def test_health_answers_while_another_process_holds_the_sqlite_write_lock(
    client: TestClient, settings: Settings, db_backend: str
) -> None:
    """Health is a read outside any transaction: a writer holding SQLite's lock (a worker
    mid-transaction) must not hold it up for the busy timeout (60 s), nor the event loop."""
    holder = sqlite3.connect(settings.effective_database_url.removeprefix("sqlite:///"), isolation_level=None)
    holder.execute("BEGIN IMMEDIATE")
    answered = threading.Event()
    result: list[object] = []

    def ask() -> None:
        result.append(client.get("/health"))
        answered.set()

    try:
        threading.Thread(target=ask, daemon=True).start()
        got_it = answered.wait(20)
    finally:
        holder.execute("ROLLBACK")
        holder.close()
        answered.wait(90)
    assert got_it, "GET /health waited for the write lock"
    r = result[0]
    assert r.status_code == 200 and r.json() == {"status": "ok", "database": "ok", "broker": "filesystem"}


def test_the_page_headers_are_on_every_static_answer_and_only_there(client: TestClient) -> None:
    """Set by a plain ASGI middleware since the per-request BaseHTTPMiddleware went: the same
    headers on the files and on a missing file's 404, none on the API's answers."""
    for path in ("/static/app.js", "/static/nope.js"):
        r = client.get(path)
        assert r.headers["x-content-type-options"] == "nosniff", path
        assert "script-src 'self'" in r.headers["content-security-policy"], path
    assert "content-security-policy" not in client.get("/health").headers
