"""A run's thinking, tool results and closing record on the web page (headless Chromium).

The rows come from the real pipeline (fake sandbox) on both databases; the
page, served by a real uvicorn server, shows the thinking muted and folded
away, the tool result (sender ``tool_result``) like any tool result, the
limit notice as a host message, and the ``result_meta`` record as one muted
line.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from agent_runner.protocol import AssistantEvent, ResultEvent, ThinkingEvent, ToolResultEvent, ToolUseEvent, Usage
from fakes.clock import FakeClock
from fakes.sandbox import FakeSandbox, Script
from orchestrator.core.settings import Settings
from orchestrator.http.api import create_app
from orchestrator.root import Orchestrator
from orchestrator.run.ingest import IncomingMessage, ingest
from orchestrator.run.outbound import ChannelRegistry
from orchestrator.run.pipeline import Pipeline
from orchestrator.store.db import Database
from orchestrator.store.groups import ensure_main_group
from orchestrator.store.message_log import get_messages_after
from tests.live_server import serve
from tests.web_browser import screenshot

JID = "main@local"
MUTED = "rgb(107, 115, 133)"  # --muted


@pytest.fixture
def base_url(db: Database, settings: Settings) -> Iterator[str]:
    with serve(create_app(Orchestrator(settings))) as url:
        yield url


def _color(page: Any, selector: str) -> str:
    return str(page.locator(selector).first.evaluate("e => getComputedStyle(e).color"))


def test_thinking_and_the_runs_record_are_muted_the_tool_result_shown(
    db: Database, settings: Settings, base_url: str, page: Any, tmp_path: Path
) -> None:
    ensure_main_group(db)
    script = Script(
        [
            ThinkingEvent(text="The user wants the files listed."),
            ToolUseEvent(id="toolu_1", name="bash", input={"command": "ls"}),
            ToolResultEvent(tool_use_id="toolu_1", name="bash", output="a.txt\n", exit_code=0),
            AssistantEvent(text="There is a.txt."),
            ResultEvent(usage=Usage(input_tokens=1234, output_tokens=56), stop_reason="max_turns", num_turns=50),
        ]
    )
    pipeline = Pipeline(settings, db, ChannelRegistry([]), FakeSandbox(script), clock=FakeClock())
    ingest(
        db,
        settings,
        IncomingMessage(chat_jid=JID, sender="web:Ann", sender_name="Ann", content="list files"),
        signal=None,
    )
    pipeline.drain_group(JID)
    ids = {m.sender: m.id for m in get_messages_after(JID, 0, db=db)}

    page.goto(f"{base_url}/#chat_jid={JID}")
    page.wait_for_selector(f"article[data-id='{ids['result_meta']}']")

    thinking = page.locator(f"article[data-id='{ids['thinking']}']")
    assert thinking.get_attribute("class") == "msg msg-thinking"
    assert thinking.locator("details").get_attribute("open") is None  # folded away
    assert not thinking.locator(".text").is_visible()
    assert _color(page, f"article[data-id='{ids['thinking']}']") == MUTED
    thinking.locator("summary").click()
    assert thinking.locator(".text").inner_text() == "The user wants the files listed."

    tool = page.locator(f"article[data-id='{ids['tool_result']}']")
    assert tool.get_attribute("class") == "msg msg-tool"
    assert tool.locator(".exit").inner_text() == "✅ exit 0"

    notice = page.locator(f"article[data-id='{ids['host']}']")
    assert notice.get_attribute("class") == "msg msg-host"
    assert "turn limit" in notice.inner_text() and "ORCHESTRATOR_MAX_TURNS" in notice.inner_text()

    record = page.locator(f"article[data-id='{ids['result_meta']}']")
    assert record.get_attribute("class") == "msg msg-result"
    assert record.locator(".who").inner_text() == "📊 run"
    line = record.locator(".result-line").inner_text()
    assert line.startswith("offline · max_turns · 50 turns · 1,234 in / 56 out tokens · ")
    assert _color(page, f"article[data-id='{ids['result_meta']}']") == MUTED
    assert record.locator("button").count() == 0  # no regenerate on a record
    screenshot(page, tmp_path, "web-run-end.png")
