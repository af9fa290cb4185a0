"""The agent's reactions on the web page (headless Chromium against a real uvicorn server,
on both databases): a badge under the message it reacted to, there when the page loads,
added live from the stream, and still there after the history changed (a reset redraws)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from agent_runner.protocol import ReactEvent, ResultEvent, Usage
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
from orchestrator.store.history import edit_message
from tests.live_server import serve
from tests.web_browser import screenshot

JID = "main@local"


@pytest.fixture
def base_url(db: Database, settings: Settings) -> Iterator[str]:
    ensure_main_group(db)
    with serve(create_app(Orchestrator(settings))) as url:
        yield url


def _say_and_react(db: Database, settings: Settings, text: str, *reactions: ReactEvent) -> tuple[int, str]:
    """A person's message, then a run of the agent that reacts; the message's seq and id."""
    msg = ingest(
        db, settings, IncomingMessage(chat_jid=JID, sender="ann", sender_name="Ann", content=text), signal=None
    )
    sandbox = FakeSandbox(Script([*reactions, ResultEvent(usage=Usage())]))
    Pipeline(settings, db, ChannelRegistry([]), sandbox, clock=FakeClock()).drain_group(JID)
    return msg.message.seq, msg.message.id


def _badges(page: Any, seq: int) -> list[str]:
    return [t.strip() for t in page.locator(f".msg[data-seq='{seq}'] .reactions .reaction").all_inner_texts()]


def test_reactions_are_badges_live_and_after_a_reset(
    db: Database, settings: Settings, base_url: str, page: Any, tmp_path: Path
) -> None:
    first, first_id = _say_and_react(db, settings, "please deploy", ReactEvent(emoji="👀"))
    page.goto(f"{base_url}/#chat_jid={JID}")
    page.wait_for_selector(f".msg[data-seq='{first}'] .reactions .reaction")
    assert _badges(page, first) == ["👀"]
    assert page.locator(f".msg[data-seq='{first}'] .reaction").first.get_attribute("title") == "👀 from the agent"
    # Live: the next run's reactions arrive on the open page (on the earlier message too).
    second, _ = _say_and_react(db, settings, "and tell me", ReactEvent(emoji="✅", nth_last=2), ReactEvent(emoji="👍"))
    page.wait_for_function(
        f"() => document.querySelectorAll(\".msg[data-seq='{first}'] .reaction\").length === 2"
        f" && document.querySelectorAll(\".msg[data-seq='{second}'] .reaction\").length === 1"
    )
    assert _badges(page, first) == ["👀", "✅"] and _badges(page, second) == ["👍"]
    # A history change resets the page's view: the badges are drawn again, once each.
    edit_message(db, settings, JID, first_id, "please deploy to staging")
    page.wait_for_selector(f".msg[data-seq='{first}'] .text >> text=staging")
    page.wait_for_function(f"() => document.querySelectorAll(\".msg[data-seq='{first}'] .reaction\").length === 2")
    assert _badges(page, first) == ["👀", "✅"] and _badges(page, second) == ["👍"]
    screenshot(page, tmp_path, "web-reactions.png")
