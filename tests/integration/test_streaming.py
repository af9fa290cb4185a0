"""Streamed replies end to end, with the real parts and a fake upstream that takes its time.

`orchestrator api` on loopback, a real Celery worker, the agent container
(no network) reaching the fake Messages API through the worker's model
gateway; the fake streams its answer a word every 150 ms.  The chat's HTTP
event stream (and the web page in headless Chromium) must show the reply's
text while the run is still running, and the reply must be stored once,
whole.
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from fakes.anthropic_api import FakeAnthropic, message, paced
from orchestrator.http.endpoint import CLIENT_HEADER
from orchestrator.store.drafts import chat_drafts
from orchestrator.store.groups import ensure_main_group
from orchestrator.store.message_log import get_messages_after
from orchestrator.store.runs import list_runs
from tests.conftest import wait_until

from .conftest import Stack
from .test_web_chat import api_url

__all__ = ["api_url"]  # a fixture, used by name

CHAT = "main@local"
WORDS = " ".join(f"word{i}" for i in range(30))
WORD_DELAY_S = 0.15  # 30 words: about 4.5 s of writing


class SseLog:
    """The chat's event stream read in a thread: (arrival, event, parsed data) in order."""

    def __init__(self, url: str) -> None:
        self.events: list[tuple[float, str, Any]] = []
        self._client = httpx.Client(timeout=httpx.Timeout(10, read=None))
        self._cm = self._client.stream("GET", url)
        self.response = self._cm.__enter__()
        self._thread = threading.Thread(target=self._read, daemon=True)
        self._thread.start()

    def _read(self) -> None:
        event, data = "message", []
        try:
            for line in self.response.iter_lines():
                if line == "":
                    if data:
                        self.events.append((time.monotonic(), event, json.loads("\n".join(data))))
                    event, data = "message", []
                elif line.startswith("event:"):
                    event = line[6:].strip()
                elif line.startswith("data:"):
                    data.append(line[5:].removeprefix(" "))
        except httpx.HTTPError:
            pass

    def close(self) -> None:
        self._client.close()


@pytest.fixture
def streaming_stack(stack: Stack) -> Iterator[tuple[Stack, FakeAnthropic]]:
    fake = FakeAnthropic(paced(message([{"type": "text", "text": WORDS}], "end_turn", n=30), WORD_DELAY_S))
    with fake.serve() as base_url:
        stack.env["ORCHESTRATOR_MODEL"] = "anthropic:claude-fake-1"
        stack.env["ORCHESTRATOR_ANTHROPIC_BASE_URL"] = base_url
        stack.env["ORCHESTRATOR_ANTHROPIC_API_KEY"] = "sk-test-streaming"
        ensure_main_group(stack.db)
        stack.start_worker()
        yield stack, fake


@pytest.mark.docker
@pytest.mark.parametrize("stack", ["embedded", "fleet"], indirect=True)
def test_the_draft_reaches_the_event_stream_before_the_run_ends(
    streaming_stack: tuple[Stack, FakeAnthropic], api_url: str
) -> None:
    stack, fake = streaming_stack
    log = SseLog(f"{api_url}/api/chats/{CHAT}/stream?after=0")
    try:
        posted = httpx.post(
            f"{api_url}/api/messages",
            json={"chat_jid": CHAT, "sender": "u", "content": "talk"},
            headers={CLIENT_HEADER: "tests"},
        )
        assert posted.status_code == 201, posted.text
        wait_until(
            lambda: any(e == "message" and d.get("sender") == "bot" for _, e, d in log.events),
            120,
            "the stored reply on the stream",
            stack.worker_logs,
        )
        wait_until(
            lambda: [r.state for r in list_runs(stack.db, chat_jid=CHAT)] == ["succeeded"],
            30,
            "the run to end",
            stack.worker_logs,
        )
        time.sleep(1)  # the stream's last ticks: the draft's end
    finally:
        log.close()

    assert fake.requests[0]["stream"] is True  # the container asked for a stream, through the gateway
    events = log.events
    drafts = [(t, d["text"]) for t, e, d in events if e == "draft" and d["text"]]
    stored_at = next(t for t, e, d in events if e == "message" and d.get("sender") == "bot")
    ended_at = next(t for t, e, d in events if e == "run" and d["state"] == "succeeded")
    assert drafts, events
    # The text grew on the stream, each draft the start of the reply, well before the run ended.
    assert all(WORDS.startswith(text) for _, text in drafts)
    assert len({text for _, text in drafts}) >= 3
    first_at = drafts[0][0]
    assert first_at < stored_at and first_at < ended_at
    assert stored_at - first_at > 2.0  # the words kept coming for seconds after the first showed
    # Gone once the reply is stored, and nothing was left behind.
    last = [d for _, e, d in events if e == "draft"][-1]
    assert last["text"] == ""
    assert chat_drafts(stack.db, CHAT) == []
    # Stored once, whole: one reply, no row per piece.
    replies = [m for m in get_messages_after(CHAT, 0, db=stack.db) if m.sender == "bot"]
    assert [m.content for m in replies] == [WORDS]


@pytest.mark.docker
@pytest.mark.parametrize("stack", ["embedded"], indirect=True)
def test_streamed_text_on_the_page_before_the_run_ends(
    streaming_stack: tuple[Stack, FakeAnthropic], api_url: str, page: Any
) -> None:
    stack, _ = streaming_stack
    page.goto(f"{api_url}/")
    page.wait_for_selector("#conn[data-state='live']")
    page.fill("#composer-text", "talk")
    page.press("#composer-text", "Enter")
    draft = page.wait_for_selector("article.msg-draft .text", timeout=120_000)
    assert draft is not None
    shown = draft.inner_text()
    assert shown and WORDS.startswith(shown)
    assert page.get_attribute("#run-status", "data-state") == "running"
    # The draft grows, then the stored reply takes its place.
    # (polled from here: the page's CSP allows no evaluated script)
    grown: list[str] = []

    def longer() -> bool:
        drafts = page.locator("article.msg-draft .text").all_inner_texts()
        grown.extend(drafts)
        return any(len(text) > len(shown) for text in drafts)

    wait_until(longer, 30, "the draft to grow")
    assert all(WORDS.startswith(text) for text in grown)
    page.wait_for_selector(f"article.msg-assistant:not(.msg-draft) >> text={WORDS}", timeout=60_000)
    page.wait_for_selector("#run-status[data-state='succeeded']", timeout=30_000)
    assert page.locator("article.msg-draft").count() == 0
    assert [r.state for r in list_runs(stack.db, chat_jid=CHAT)] == ["succeeded"]
