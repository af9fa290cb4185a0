"""The agent's questions on the web page (headless Chromium against a real uvicorn server,
on both databases): a question's options are buttons; a click answers it through
``POST /api/chats/{chat_jid}/questions/{id}/answer`` and greys them out, naming the answer;
a question answered elsewhere is greyed out when the page loads, or as soon as the answer
arrives on the stream; free words go through the text box; a multiple choice takes several."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from orchestrator.core.settings import Settings
from orchestrator.http.api import create_app
from orchestrator.root import Orchestrator
from orchestrator.run.questions import answer_question
from orchestrator.store.db import Database
from orchestrator.store.groups import ensure_main_group, get_group
from orchestrator.store.questions import read_question
from tests.host.asked import stored_question
from tests.live_server import serve
from tests.web_browser import screenshot

JID = "main@local"


@pytest.fixture
def base_url(db: Database, settings: Settings) -> Iterator[str]:
    ensure_main_group(db)
    with serve(create_app(Orchestrator(settings))) as url:
        yield url


def _box(page: Any, qid: str) -> Any:
    return page.locator(f".question[data-question-id='{qid}']")


def test_a_click_answers_the_question_and_greys_it_out(db: Database, base_url: str, page: Any, tmp_path: Path) -> None:
    asked, _ = stored_question(db, JID, "Which colour <b>?", ["red", "blue"])
    page.goto(f"{base_url}/#chat_jid={JID}")
    box = _box(page, asked.id)
    box.locator("button.option", has_text="blue").wait_for()
    assert box.locator(".question-text").inner_text() == "Which colour <b>?"  # text, never markup
    assert box.locator("button.option").all_inner_texts() == ["red", "blue"]
    box.locator("button.option", has_text="blue").click()
    page.wait_for_selector(f".question[data-question-id='{asked.id}'][data-state='answered']")
    assert box.locator(".question-note").inner_text() == "Answered: blue (by operator via api)"
    assert all(b.is_disabled() for b in box.locator("button").all())
    assert "chosen" in (box.locator("button.option", has_text="blue").get_attribute("class") or "")
    answered = read_question(db, asked.id)
    assert answered is not None and answered.state == "answered" and (answered.answer or {})["options"] == ["blue"]
    group = get_group(db, JID)
    assert group is not None and group.pending_seq is not None  # the answer woke the group
    screenshot(page, tmp_path, "web-question.png")


def test_an_answer_given_elsewhere_greys_the_buttons(db: Database, base_url: str, page: Any) -> None:
    before, _ = stored_question(db, JID, "Ship it?", ["yes", "no"])
    answer_question(db, JID, "no", via="cli", question_id=before.id)
    asked, _ = stored_question(db, JID, "Which colour?", ["red", "blue"])
    page.goto(f"{base_url}/#chat_jid={JID}")
    page.wait_for_selector(f".question[data-question-id='{before.id}'][data-state='answered']")
    assert _box(page, before.id).locator(".question-note").inner_text() == "Answered: no (by operator via cli)"
    open_box = _box(page, asked.id)
    assert not open_box.locator("button.option").first.is_disabled()
    # Answered from a channel while the page is open: the stream's answer greys it out.
    answer_question(db, JID, "red", by="slack:UANN0001", by_name="Ann", via="slack", question_id=asked.id)
    page.wait_for_selector(f".question[data-question-id='{asked.id}'][data-state='answered']")
    assert open_box.locator(".question-note").inner_text() == "Answered: red (by Ann via slack)"
    assert open_box.locator("button.option").first.is_disabled()


def test_free_words_and_several_options(db: Database, base_url: str, page: Any) -> None:
    other, _ = stored_question(db, JID, "Which colour?", ["red", "blue"], allow_other=True)
    page.goto(f"{base_url}/#chat_jid={JID}")
    box = _box(page, other.id)
    box.locator("input.question-other-text").fill("teal, please")
    box.locator(".question-other button").click()
    page.wait_for_selector(f".question[data-question-id='{other.id}'][data-state='answered']")
    assert (read_question(db, other.id).answer or {})["text"] == "teal, please"  # type: ignore[union-attr]
    several, _ = stored_question(db, JID, "Which days?", ["mon", "tue", "wed"], multiple=True)
    box = _box(page, several.id)
    box.locator("button.option", has_text="mon").wait_for()
    box.locator("button.option", has_text="mon").click()
    box.locator("button.option", has_text="wed").click()
    box.locator("button.question-send").click()
    page.wait_for_selector(f".question[data-question-id='{several.id}'][data-state='answered']")
    assert (read_question(db, several.id).answer or {})["options"] == ["mon", "wed"]  # type: ignore[union-attr]
