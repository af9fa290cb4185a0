"""People's edits come back: a Slack ``message_changed`` (through the signed Events API
route) or a Telegram ``edited_message`` (through the poller) by the message's own sender
becomes an edit in the history (the old text kept, the other channels' copies updated,
the agent not run again), on a real database against the fake APIs; an edit by anyone
else, a forged author, a bot's change and a message never stored are ignored and logged."""

from __future__ import annotations

import json
import logging
import os
import subprocess
import sys
from collections.abc import Iterator
from typing import Any

import pytest
from fastapi.testclient import TestClient

from fakes.platforms import Platforms, fake_platforms, pointed_at
from fakes.slack_api import FakeSlack
from fakes.telegram_api import FakeTelegramAPI
from orchestrator.channels.slack import SlackChannel
from orchestrator.channels.slack_inbound import EVENTS_PATH, signed_headers
from orchestrator.channels.telegram import TelegramChannel
from orchestrator.channels.telegram_poller import TelegramPoller
from orchestrator.core.settings import Settings
from orchestrator.http.api import create_app
from orchestrator.root import Orchestrator
from orchestrator.run.outbound import ChannelRegistry, Deliverer
from orchestrator.store.attachments import attach_channel
from orchestrator.store.db import Database
from orchestrator.store.groups import add_group, find_group
from orchestrator.store.history import EDIT_HISTORY_KEY
from orchestrator.store.message_log import get_messages_after
from orchestrator.store.runs import list_runs

JID = "team@chat"
SLACK_CHANNEL = "C0TEAM0001"
TG_CHAT = -1001234567890
SIGNING = "slack-signing-secret-edits"


@pytest.fixture
def fakes() -> Iterator[Platforms]:
    with fake_platforms() as both:
        yield both


@pytest.fixture
def team(db: Database, settings: Settings, fakes: Platforms) -> Settings:
    add_group(db, chat_jid=JID, name="Team", folder="team", requires_trigger=True, assistant_name="Robo")
    attach_channel(db, JID, "slack", address=SLACK_CHANNEL)
    attach_channel(db, JID, "telegram", address=str(TG_CHAT))
    return pointed_at(settings, fakes, slack_signing_secret=SIGNING)


@pytest.fixture
def client(team: Settings) -> Iterator[TestClient]:
    with TestClient(create_app(Orchestrator(team))) as c:
        yield c


@pytest.fixture
def deliverer(db: Database, team: Settings) -> Iterator[Deliverer]:
    registry = ChannelRegistry([SlackChannel(team, db=db), TelegramChannel(team, db=db)])
    yield Deliverer(db, team, registry)
    registry.close()


def _event(client: TestClient, doc: Any) -> None:
    body = json.dumps(doc).encode()
    answer = client.post(EVENTS_PATH, content=body, headers=signed_headers(SIGNING, body))
    assert answer.status_code == 200 and answer.json() == {"ok": True}


def _history(settings: Settings) -> str:
    """``orchestrator history`` as a person runs it."""
    env = {
        **os.environ,
        "ORCHESTRATOR_DATA_DIR": str(settings.data_dir),
        "ORCHESTRATOR_DATABASE_URL": settings.database_url,
    }
    done = subprocess.run(
        [str(os.path.join(os.path.dirname(sys.executable), "orchestrator")), "history", JID, "--json"],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr
    return done.stdout


def test_a_slack_edit_by_its_author_edits_the_history_and_reruns_nothing(
    db: Database,
    team: Settings,
    client: TestClient,
    deliverer: Deliverer,
    fakes: tuple[FakeSlack, FakeTelegramAPI],
) -> None:
    slack, telegram = fakes
    said = slack.message_event(SLACK_CHANNEL, "UANN0001", f"<@{slack.bot_user}> plan A")
    _event(client, said)
    deliverer.deliver_due()  # mirrored to Telegram
    [mirrored] = telegram.live(TG_CHAT)
    assert mirrored.text == "Ann Lee: @Robo plan A"
    before = find_group(db, JID)
    assert before is not None

    _event(client, slack.changed_event(SLACK_CHANNEL, "UANN0001", said["event"]["ts"], f"<@{slack.bot_user}> plan B"))
    [stored] = get_messages_after(JID, 0, db=db)
    assert stored.content == "@Robo plan B" and stored.edited_at is not None  # read as a new message is
    assert [e["content"] for e in (stored.metadata or {})[EDIT_HISTORY_KEY]] == ["@Robo plan A"]
    after = find_group(db, JID)
    assert after is not None and (after.pending_seq, after.cursor_seq) == (before.pending_seq, before.cursor_seq)
    assert list_runs(db, chat_jid=JID) == []  # nothing reran
    # The copy on the other channel follows, in place; nothing goes back to Slack.
    assert deliverer.deliver_due().changed == 1
    assert [(m.message_id, m.text) for m in telegram.live(TG_CHAT)] == [(mirrored.message_id, "Ann Lee: @Robo plan B")]
    assert slack.live_posts() == []
    shown = [m for m in json.loads(_history(team)) if m["id"] == stored.id]
    assert [m["content"] for m in shown] == ["@Robo plan B"]


def test_slack_edits_by_anyone_else_bots_and_forgeries_are_ignored_and_logged(
    db: Database,
    team: Settings,
    client: TestClient,
    fakes: tuple[FakeSlack, FakeTelegramAPI],
    caplog: pytest.LogCaptureFixture,
) -> None:
    slack, _ = fakes
    said = slack.message_event(SLACK_CHANNEL, "UANN0001", "my own words")
    _event(client, said)
    ts = said["event"]["ts"]
    with caplog.at_level(logging.INFO, logger="orchestrator"):
        # Someone else (an admin) edited Ann's message.
        _event(
            client, slack.changed_event(SLACK_CHANNEL, "UANN0001", ts, "words put in Ann's mouth", editor="UBOB0002")
        )
        # A forgery: Bob claims to be the author of Ann's message.
        _event(client, slack.changed_event(SLACK_CHANNEL, "UBOB0002", ts, "mine now"))
        # A bot's change (our own chat.update looks like this).
        _event(client, slack.changed_event(SLACK_CHANNEL, "UANN0001", ts, "bot text", bot_id="B0000001"))
        # A message never stored, and a message that is not one.
        _event(client, slack.changed_event(SLACK_CHANNEL, "UANN0001", "1700000000.000999", "ghost"))
        bad = slack.changed_event(SLACK_CHANNEL, "UANN0001", ts, "x")
        bad["event"]["message"]["text"] = ["not", "text"]
        _event(client, bad)
    [stored] = get_messages_after(JID, 0, db=db)
    assert stored.content == "my own words" and stored.edited_at is None
    logged = caplog.text
    assert "UBOB0002 edited UANN0001's message" in logged
    assert "the message is slack:UANN0001's, not the editor's" in logged
    assert "no such message stored" in logged and "not understood" in logged


def test_a_telegram_edit_by_its_sender_edits_the_history_and_anyone_elses_is_ignored(
    db: Database, team: Settings, fakes: tuple[FakeSlack, FakeTelegramAPI], caplog: pytest.LogCaptureFixture
) -> None:
    _, telegram = fakes
    telegram.push_text(TG_CHAT, 42, "meet at noon", message_id=7)
    poller = TelegramPoller(db, team)
    try:
        poller.poll_once()
        telegram.push_edit(TG_CHAT, 42, 7, "meet at one")
        poller.poll_once()
        [stored] = get_messages_after(JID, 0, db=db)
        assert (stored.id, stored.content) == (f"tg-{TG_CHAT}-7", "meet at one")
        assert [e["content"] for e in (stored.metadata or {})[EDIT_HISTORY_KEY]] == ["meet at noon"]
        with caplog.at_level(logging.INFO, logger="orchestrator"):
            telegram.push_edit(TG_CHAT, 43, 7, "meet never", first_name="Mallory")
            telegram.push_edit(TG_CHAT, 42, 99, "a message never stored")
            poller.poll_once()
    finally:
        poller.close()
    [stored] = get_messages_after(JID, 0, db=db)
    assert stored.content == "meet at one"
    assert "the message is tg:42's, not the editor's" in caplog.text and "no such message stored" in caplog.text
    assert "edited_message" in telegram.calls("getUpdates")[-1].params["allowed_updates"]
    assert list_runs(db, chat_jid=JID) == []
