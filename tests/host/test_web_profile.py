"""The group's profile on the web page (issue 32, the page's part): headless Chromium against a
real uvicorn server and database (both backends).  The panel shows what the group's runs get
(model, max tokens, thinking budget, the names that wake it, its tools, its quotas), whose
each value is, and its scheduled tasks; a change made in its form is what
``GET /api/groups/{chat_jid}`` reads back, told in the chat by its 🏠 message; an empty box
gives the field back to the installation; a refused value is shown under its field with the
server's words, and nothing typed is lost."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from orchestrator.core.settings import Settings
from orchestrator.http.api import create_app
from orchestrator.root import Orchestrator
from orchestrator.run.profile import change_profile
from orchestrator.run.schedules import add_task
from orchestrator.store.db import Database
from orchestrator.store.groups import add_group, ensure_main_group
from orchestrator.store.schedules import set_task_state
from tests.live_server import serve
from tests.web_browser import screenshot

MAIN = "main@local"
TEAM = "team@local"
ALL_TOOLS = ["send_message", "send_file", "schedules", "questions", "message_changes"]


@pytest.fixture
def base_url(db: Database, settings: Settings) -> Iterator[str]:
    ensure_main_group(db)
    add_group(db, chat_jid=TEAM, name="Team", folder="team")
    with serve(create_app(Orchestrator(settings))) as url:
        yield url


def _stored(base_url: str, jid: str) -> dict[str, Any]:
    r = httpx.get(f"{base_url}/api/groups/{jid}")
    assert r.status_code == 200, r.text
    profile: dict[str, Any] = r.json()
    return profile


def _open(page: Any, base_url: str, jid: str) -> None:
    page.goto(f"{base_url}/#chat_jid={jid}")
    page.locator("#profile-toggle:not([disabled])").click()
    page.locator(".effect-row[data-field=model] .effect-value").wait_for()


def _effect(page: Any) -> dict[str, tuple[str, str]]:
    """Each row of "In effect": (the value shown, whose it is)."""
    rows = page.locator(".effect-row")
    return {
        rows.nth(i).get_attribute("data-field"): (
            rows.nth(i).locator(".effect-value").inner_text(),
            rows.nth(i).locator(".whose").inner_text(),
        )
        for i in range(rows.count())
    }


def _whole_panel(page: Any) -> None:
    """A viewport tall enough for the whole panel, scrolled to its top (for the screenshot)."""
    tall = page.evaluate(
        "() => { const p = document.getElementById('profile'); p.scrollTop = 0; return p.scrollHeight; }"
    )
    page.set_viewport_size({"width": 1280, "height": max(900, min(tall + 20, 4000))})


def _wait_effect(page: Any, field: str, value: str) -> None:
    page.wait_for_function(
        "([field, value]) => { const v = document.querySelector(`.effect-row[data-field=${field}] .effect-value`);"
        " return v !== null && v.textContent === value; }",
        arg=[field, value],
    )


def test_the_profile_is_shown_and_a_change_made_in_the_page_is_read_back(
    db: Database, settings: Settings, base_url: str, page: Any, tmp_path: Path
) -> None:
    change_profile(db, settings, TEAM, {"tokens_per_day": 50_000})
    add_task(db, chat_jid=TEAM, prompt="report", kind="interval", spec="1h")
    paused = add_task(db, chat_jid=TEAM, prompt="tidy up", kind="cron", spec="0 9 * * 1")
    set_task_state(db, paused.id, "paused")
    _open(page, base_url, TEAM)
    assert _effect(page) == {
        "model": ("offline", "installation's"),
        "max_tokens": ("1,024", "installation's"),
        "thinking_budget": ("off", "installation's"),
        "trigger_names": ("@Andy", "installation's"),
        "tools": (", ".join(ALL_TOOLS) + " (all)", "installation's"),
        "runs_per_hour": ("no limit", "installation's"),
        "tokens_per_day": ("50,000", "group's own"),
    }
    assert page.locator("#profile-tasks").inner_text() == "2 scheduled tasks: 1 active, 1 paused, 0 done, 0 cancelled"
    # The form holds the group's own values; an empty box shows the installation's.
    assert page.locator("#profile-tokens_per_day").input_value() == "50000"
    assert page.locator("#profile-model").input_value() == ""
    assert page.locator("#profile-model").get_attribute("placeholder") == "installation's: offline"
    assert page.locator("#profile-max_tokens").get_attribute("placeholder") == "installation's: 1,024"
    assert page.locator("#profile-tools-all").is_checked()
    assert page.locator("#profile-tools-list input:checked").count() == len(ALL_TOOLS)

    page.locator("#profile-model").fill("openai:test-model")
    page.locator("#profile-max_tokens").fill("2048")
    page.locator("#profile-trigger_names").fill("@Bee, Robo")
    page.locator("#profile-tools-some").check()
    page.locator("#profile-tools-list input[value=schedules]").uncheck()
    page.locator("#profile-runs_per_hour").fill("5")
    page.locator("#profile-tokens_per_day").fill("")  # back to the installation's
    page.locator("#profile-save").click()
    page.wait_for_selector("#profile-status.saved")

    stored = _stored(base_url, TEAM)
    assert {k: stored[k] for k in ("model", "max_tokens", "thinking_budget", "trigger_names", "tools")} == {
        "model": "openai:test-model",
        "max_tokens": 2048,
        "thinking_budget": None,  # not touched: still the installation's
        "trigger_names": ["Bee", "Robo"],
        "tools": [t for t in ALL_TOOLS if t != "schedules"],
    }
    assert (stored["runs_per_hour"], stored["tokens_per_day"]) == (5, None)
    # The change's host message reaches the chat, as any change of the profile does.
    note = page.locator(".msg-host", has_text="openai:test-model")
    note.wait_for()
    assert "model the installation's (offline) -> openai:test-model" in note.inner_text()
    assert "The model changed: the group's session starts afresh." in note.inner_text()
    _wait_effect(page, "model", "openai:test-model")
    assert _effect(page) == {
        "model": ("openai:test-model", "group's own"),
        "max_tokens": ("2,048", "group's own"),
        "thinking_budget": ("off", "installation's"),
        "trigger_names": ("@Bee, @Robo", "group's own"),
        "tools": ("send_message, send_file, questions, message_changes", "group's own"),
        "runs_per_hour": ("5", "group's own"),
        "tokens_per_day": ("no limit", "installation's"),
    }
    assert page.locator("#profile-trigger_names").input_value() == "Bee, Robo"
    _whole_panel(page)
    screenshot(page, tmp_path, "web-profile.png")
    page.set_viewport_size({"width": 1280, "height": 900})

    # Emptied boxes and "all of them": every field back to the installation's.
    for field in ("model", "max_tokens", "trigger_names", "runs_per_hour"):
        page.locator(f"#profile-{field}").fill("")
    page.locator("#profile-tools-all").check()
    page.locator("#profile-save").click()
    _wait_effect(page, "model", "offline")
    stored = _stored(base_url, TEAM)
    assert [stored[k] for k in ("model", "max_tokens", "trigger_names", "tools", "runs_per_hour")] == [None] * 5
    assert {whose for _, whose in _effect(page).values()} == {"installation's"}
    # Nothing left to change: no request, no message.
    page.locator("#profile-save").click()
    page.wait_for_function("() => document.getElementById('profile-status').textContent === 'Nothing to change.'")


def test_a_refused_value_is_shown_by_its_field_and_nothing_typed_is_lost(
    db: Database, base_url: str, page: Any, tmp_path: Path
) -> None:
    _open(page, base_url, MAIN)
    assert _effect(page)["trigger_names"] == ("every message (names: @Andy)", "installation's")
    page.locator("#profile-model").fill("gemini:pro")
    page.locator("#profile-max_tokens").fill("4096")
    page.locator("#profile-trigger_names").fill("Bee")
    page.locator("#profile-save").click()
    error = page.locator("#profile-model-error")
    error.wait_for()
    # The server's own words (a 400 naming the field), under the field, which keeps its text.
    assert "model: 'gemini:pro' is not a model; use 'offline'" in error.inner_text()
    assert page.locator("#profile-model").get_attribute("aria-invalid") == "true"
    assert page.locator("#profile-status").inner_text() == "Not saved."
    assert page.evaluate("() => document.activeElement.id") == "profile-model"
    assert [page.locator(f"#profile-{f}").input_value() for f in ("model", "max_tokens", "trigger_names")] == [
        "gemini:pro",
        "4096",
        "Bee",
    ]
    _whole_panel(page)
    page.screenshot(path=str(tmp_path / "web-profile-refused.png"))  # the test's folder only
    page.set_viewport_size({"width": 1280, "height": 900})
    # All or nothing: the valid fields of a refused change were not made either.
    stored = _stored(base_url, MAIN)
    assert (stored["model"], stored["max_tokens"], stored["trigger_names"]) == (None, None, None)

    # A budget the model in effect cannot think with: the server names thinking_budget.
    page.locator("#profile-model").fill("")
    page.locator("#profile-thinking_budget").fill("2048")
    page.locator("#profile-save").click()
    page.locator("#profile-thinking_budget-error").wait_for()
    assert page.locator("#profile-model-error").is_hidden()
    assert "does not think" in page.locator("#profile-thinking_budget-error").inner_text()
    assert page.locator("#profile-thinking_budget").input_value() == "2048"

    # Refused by the API's schema (max tokens at least 1): its field too.
    page.locator("#profile-thinking_budget").fill("")
    page.locator("#profile-max_tokens").fill("0")
    page.locator("#profile-save").click()
    page.locator("#profile-max_tokens-error").wait_for()
    assert page.locator("#profile-max_tokens").input_value() == "0"

    # A word where a number goes is refused before anything is sent.
    page.locator("#profile-max_tokens").fill("4096")
    page.locator("#profile-runs_per_hour").fill("lots")
    page.locator("#profile-save").click()
    page.locator("#profile-runs_per_hour-error").wait_for()
    assert page.locator("#profile-max_tokens-error").is_hidden()
    assert _stored(base_url, MAIN)["max_tokens"] is None

    # Put right, it goes through, and the errors are gone.
    page.locator("#profile-runs_per_hour").fill("0")
    page.locator("#profile-save").click()
    page.wait_for_selector("#profile-status.saved")
    assert page.locator(".field-error:not([hidden])").count() == 0
    stored = _stored(base_url, MAIN)
    assert (stored["max_tokens"], stored["runs_per_hour"], stored["trigger_names"]) == (4096, 0, ["Bee"])
    _wait_effect(page, "runs_per_hour", "no limit")
    assert _effect(page)["runs_per_hour"] == ("no limit", "group's own")


def test_a_change_made_elsewhere_reaches_the_open_panel(
    db: Database, settings: Settings, base_url: str, page: Any
) -> None:
    _open(page, base_url, TEAM)
    page.locator("#profile-runs_per_hour").fill("7")  # typed, not saved: kept
    # As `orchestrator groups set` would: its host message reaches the page, which reads again.
    change_profile(db, settings, TEAM, {"max_tokens": 3000})
    _wait_effect(page, "max_tokens", "3,000")
    assert _effect(page)["max_tokens"] == ("3,000", "group's own")
    assert page.locator("#profile-runs_per_hour").input_value() == "7"
    # Another group's profile when another group is chosen.
    page.locator(f".group[data-jid='{MAIN}']").click()
    _wait_effect(page, "max_tokens", "1,024")
    assert page.locator("#profile-runs_per_hour").input_value() == ""
