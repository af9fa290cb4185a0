"""A run's egress log on the web page (issue 35; headless Chromium against a real uvicorn server
and database, both backends): the run's ``egress_log`` record is a collapsed 🌐 line that,
opened, reads ``GET /api/runs/{run_id}/egress`` and lists every decision (time, method,
host:port, the path of an intercepted request, bytes each way, allowed or refused and why) and
the count the capped log left out.  What the sandbox asked for is hostile: a path made of
markup is shown as text; a record whose run cannot be read says so."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from orchestrator.core.settings import Settings
from orchestrator.http.api import create_app
from orchestrator.model.messages import SENDER_EGRESS_LOG
from orchestrator.root import Orchestrator
from orchestrator.store.db import Database
from orchestrator.store.groups import ensure_main_group
from orchestrator.store.message_log import now_iso, store_message_direct
from orchestrator.store.runs import create_run
from tests.live_server import serve
from tests.web_browser import screenshot

JID = "main@local"
HOSTILE_PATH = "/repos/<img src=x onerror=window.pwned=1>/x"


@pytest.fixture
def base_url(db: Database, settings: Settings) -> Iterator[str]:
    ensure_main_group(db)
    with serve(create_app(Orchestrator(settings))) as url:
        yield url


def _decision(host: str, port: int, allowed: bool, reason: str, **more: Any) -> dict[str, Any]:
    return {"at": time.time(), "method": "GET", "host": host, "port": port, "allowed": allowed, "reason": reason,
            "sent": 0, "received": 0, **more}  # fmt: skip


def _record(db: Database, run_id: str, decisions: list[dict[str, Any]], left_out: int) -> str:
    """The record a run's egress proxy leaves (``run/chat_outputs.py``: ``egress``)."""
    mid = f"{run_id}-egress-0000"
    store_message_direct(
        db=db, id=mid, chat_jid=JID, timestamp=now_iso(), is_from_me=True, sender=SENDER_EGRESS_LOG,
        sender_name="egress", content=f"{len(decisions) + left_out} egress decision(s)", message_type="system",
        metadata={"decisions": decisions, "left_out": left_out, "bytes": 4096, "run_id": run_id},
    )  # fmt: skip
    return mid


def test_the_egress_decisions_are_listed_when_opened(db: Database, base_url: str, page: Any, tmp_path: Path) -> None:
    run = create_run(db, chat_jid=JID, cursor_from=0, cursor_to=0, celery_task_id=None)
    mid = _record(
        db,
        run.id,
        [
            _decision("files.internal.test", 8080, True, "allowed", sent=120, received=3400),
            _decision("other.internal.test", 443, False, "other.internal.test:443 is not on this group's allowlist",
                      method="CONNECT"),
            _decision("api.github.com", 443, True, "intercepted for the credential 'github'", path=HOSTILE_PATH,
                      sent=300, received=276),
        ],
        left_out=7,
    )  # fmt: skip
    page.goto(f"{base_url}/#chat_jid={JID}")
    record = page.locator(f"article[data-id='{mid}']")
    record.wait_for()
    assert record.locator(".who").inner_text() == "🌐 network"
    assert record.locator("summary").inner_text() == "10 egress decision(s)"
    assert record.locator(".egress-row").count() == 0  # read only when opened

    record.locator("summary").click()
    page.wait_for_selector(f"article[data-id='{mid}'] details.egress[data-state='read']")
    rows = record.locator(".egress-row")
    assert rows.count() == 3
    cells = [[c.strip() for c in rows.nth(i).locator("td").all_inner_texts()] for i in range(3)]
    assert [c[1:] for c in cells] == [
        ["GET", "files.internal.test:8080", "—", "↑120 ↓3,400", "✅ allowed", "allowed"],
        ["CONNECT", "other.internal.test:443", "—", "↑0 ↓0", "🚫 refused",
         "other.internal.test:443 is not on this group's allowlist"],
        ["GET", "api.github.com:443", HOSTILE_PATH, "↑300 ↓276", "✅ allowed", "intercepted for the credential 'github'"],
    ]  # fmt: skip
    assert all(c[0].count(":") == 2 for c in cells)  # the time, to the second
    assert [rows.nth(i).get_attribute("data-allowed") for i in range(3)] == ["true", "false", "true"]
    # The sandbox's path is text, never markup: no element made of it, nothing ran.
    assert page.locator("img[src='x']").count() == 0 and page.evaluate("window.pwned") is None
    refused = record.locator(".egress-row.refused .egress-verdict")
    assert refused.evaluate("e => getComputedStyle(e).color") == "rgb(207, 34, 46)"
    total = record.locator(".egress-total")
    assert total.get_attribute("data-left-out") == "7"
    assert total.inner_text() == "3 decisions, 1 refused, 4,096 bytes in all; 7 more not kept (the run's log is capped)"
    screenshot(page, tmp_path, "web-egress.png")


def test_a_record_whose_run_cannot_be_read_says_so(db: Database, base_url: str, page: Any) -> None:
    mid = _record(db, "no-such-run", [_decision("files.internal.test", 80, True, "allowed")], left_out=0)
    page.goto(f"{base_url}/#chat_jid={JID}")
    record = page.locator(f"article[data-id='{mid}']")
    record.locator("summary").click()
    error = record.locator(".egress-error")
    error.wait_for()
    assert error.inner_text().startswith("Could not read the egress log: ")
    assert "no-such-run" in error.inner_text() or "not found" in error.inner_text().lower()
    assert record.locator(".egress-row").count() == 0
