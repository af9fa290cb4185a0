"""The agent reacts (``add_reaction``; issue 34 item 4), through runs of the pipeline with the
fake sandbox, on a real database, against the fake Slack and Telegram APIs and a webhook
receiver on loopback: the reaction is kept once and reaches the channel the person wrote on
(by its own post: the inbound id) and every channel that mirrored the message, exactly once;
an emoji Telegram cannot show is cancelled there with the reason and shown elsewhere; what
the host refuses is said in the chat (a hostile runner's emoji outside the table too); the
page's stream sends each reaction once, and again after a reset."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import pytest

from agent_runner.protocol import Event, ReactEvent, ResultEvent, Usage
from fakes.clock import FakeClock
from fakes.platforms import Platforms, fake_platforms, pointed_at
from fakes.sandbox import FakeSandbox, Script
from fakes.webhook_receiver import WebhookReceiver
from orchestrator.channels.slack import SlackChannel
from orchestrator.channels.telegram import TelegramChannel
from orchestrator.channels.webhook import REACTION_EVENT, WebhookChannel
from orchestrator.core.settings import Settings
from orchestrator.http.stream import ChatStream
from orchestrator.run.ingest import IncomingMessage, ingest
from orchestrator.run.outbound import ChannelRegistry, Deliverer
from orchestrator.run.pipeline import Pipeline
from orchestrator.run.profile import change_profile
from orchestrator.store.attachments import attach_channel
from orchestrator.store.db import Database
from orchestrator.store.deliveries import list_deliveries
from orchestrator.store.delivery_changes import list_changes
from orchestrator.store.groups import add_group
from orchestrator.store.history import truncate_after
from orchestrator.store.message_log import get_messages_after
from orchestrator.store.reactions import reactions_after

JID = "team@chat"
SLACK_CHANNEL = "C0TEAM0001"
TG_CHAT = -1001234567890
SECRET = "outbound-secret-for-reactions"


@pytest.fixture
def fakes() -> Iterator[Platforms]:
    with fake_platforms() as both:
        yield both


@pytest.fixture
def team(db: Database, settings: Settings, fakes: Platforms) -> Settings:
    add_group(db, chat_jid=JID, name="Team", folder="team", requires_trigger=False, assistant_name="Robo")
    return pointed_at(settings, fakes, webhook_secret=SECRET, delivery_retry_base_s=0.01, delivery_retry_max_s=0.02)


@pytest.fixture
def registry(db: Database, team: Settings) -> Iterator[ChannelRegistry]:
    reg = ChannelRegistry([SlackChannel(team, db=db), TelegramChannel(team, db=db), WebhookChannel(team)])
    yield reg
    reg.close()


def _from_slack(db: Database, settings: Settings, slack: Any, text: str) -> str:
    """A person's message that came from the fake Slack's conversation; its ts there."""
    ts = str(slack.message_event(SLACK_CHANNEL, "UANN0001", text)["event"]["ts"])
    incoming = IncomingMessage(
        chat_jid=JID,
        sender="slack:UANN0001",
        sender_name="Ann",
        content=text,
        id=f"slack-{SLACK_CHANNEL}-{ts}",
        channel="slack",
    )
    ingest(db, settings, incoming, signal=None)
    return ts


def _run(settings: Settings, db: Database, registry: ChannelRegistry, *events: Event) -> None:
    sandbox = FakeSandbox(Script([*events, ResultEvent(usage=Usage())]))
    Pipeline(settings, db, registry, sandbox, clock=FakeClock()).drain_group(JID)


def _hosts(db: Database) -> list[str]:
    return [m.content for m in get_messages_after(JID, 0, db=db) if m.message_type == "host"]


def _changes(db: Database) -> list[tuple[str, str, str, str | None]]:
    return [(c.channel, c.kind, c.state, c.last_error) for c in list_changes(db, chat_jid=JID)]


def test_a_reaction_reaches_where_the_person_wrote_and_every_mirror_once(
    db: Database, team: Settings, registry: ChannelRegistry, fakes: Platforms
) -> None:
    slack, telegram = fakes
    with WebhookReceiver(SECRET) as receiver:
        attach_channel(db, JID, "slack", address=SLACK_CHANNEL)
        attach_channel(db, JID, "telegram", address=str(TG_CHAT))
        attach_channel(db, JID, "webhook", address=receiver.url)
        ts = _from_slack(db, team, slack, "please deploy")
        deliverer = Deliverer(db, team, registry)
        assert deliverer.deliver_due().sent == 2  # mirrored to Telegram and the webhook, not back to Slack
        [mirror] = telegram.live(TG_CHAT)

        _run(team, db, registry, ReactEvent(emoji="👍"))
        assert _hosts(db) == []
        [kept] = reactions_after(db, JID)
        assert (kept.emoji, kept.sender, kept.run_id is not None) == ("👍", "bot", True)
        deliverer.deliver_due()
        assert slack.reactions == {(SLACK_CHANNEL, ts): ["+1"]}  # on the person's own post
        assert telegram.reactions == {(str(TG_CHAT), mirror.message_id): ["👍"]}  # on our mirror of it
        [reacted] = [p for p in receiver.taken() if p.doc["event"] == REACTION_EVENT]
        assert reacted.signed and reacted.doc["emoji"] == "👍"
        [sent] = [d for d in list_deliveries(db, chat_jid=JID) if d.channel == "webhook"]
        assert reacted.doc["message"]["delivery_id"] == sent.sent_ids[0]  # type: ignore[index]
        assert reacted.delivery_id == reacted.doc["delivery_id"] and "-react-" in reacted.delivery_id
        assert sorted(_changes(db)) == [
            ("slack", "react", "done", None),
            ("telegram", "react", "done", None),
            ("webhook", "react", "done", None),
        ]

        # The same again changes nothing; an emoji Telegram cannot show goes elsewhere, said why there.
        _from_slack(db, team, slack, "and tell me when it is done")
        _run(team, db, registry, ReactEvent(emoji="👍", nth_last=2), ReactEvent(emoji="✅", nth_last=2))
        for _ in range(3):
            deliverer.deliver_due()
        assert [r.emoji for r in reactions_after(db, JID)] == ["👍", "✅"]
        assert slack.reactions == {(SLACK_CHANNEL, ts): ["+1", "white_check_mark"]}
        assert telegram.reactions == {(str(TG_CHAT), mirror.message_id): ["👍"]}
        assert ("telegram", "react", "cancelled", "telegram cannot show ✅") in _changes(db)
        assert [p.doc["emoji"] for p in receiver.taken() if p.doc["event"] == REACTION_EVENT] == ["👍", "✅"]
        # Exactly once: each reaction was asked of each platform once (✅ never of Telegram).
        assert len(slack.calls("reactions.add")) == 2 and len(telegram.calls("setMessageReaction")) == 1
        assert _hosts(db) == []


def test_a_message_from_telegram_gets_the_reaction_on_its_own_post(
    db: Database, team: Settings, registry: ChannelRegistry, fakes: Platforms
) -> None:
    _, telegram = fakes
    attach_channel(db, JID, "telegram", address=str(TG_CHAT))
    update = telegram.push_text(TG_CHAT, 42, "ship it")
    mid = update["message"]["message_id"]
    incoming = IncomingMessage(
        chat_jid=JID, sender="tg:42", sender_name="Ann", content="ship it", id=f"tg-{TG_CHAT}-{mid}", channel="telegram"
    )
    ingest(db, team, incoming, signal=None)
    _run(team, db, registry, ReactEvent(emoji="❤️"))
    Deliverer(db, team, registry).deliver_due()
    assert telegram.reactions == {(str(TG_CHAT), mid): ["❤"]}  # Telegram's form of the heart
    [call] = telegram.calls("setMessageReaction")
    assert json.loads(call.params["reaction"]) == [{"type": "emoji", "emoji": "❤"}]


def test_what_the_host_will_not_do_is_said_in_the_chat(
    db: Database, team: Settings, registry: ChannelRegistry, fakes: Platforms
) -> None:
    slack, _ = fakes
    attach_channel(db, JID, "slack", address=SLACK_CHANNEL)
    _from_slack(db, team, slack, "hello")
    # A hostile runner's emoji outside the table, and a message that is not there.
    _run(team, db, registry, ReactEvent(emoji="🦖"), ReactEvent(emoji="👍", nth_last=5))
    assert _hosts(db) == [
        "🚫 add_reaction refused: '🦖' is not one of the reactions every channel takes",
        "🚫 add_reaction refused: there is no message 5 back from a person in this chat to react to",
    ]
    change_profile(db, team, JID, {"tools": ["send_message"]})
    _from_slack(db, team, slack, "again")
    _run(team, db, registry, ReactEvent(emoji="👍"))
    assert "message_changes is not among this group's tools" in _hosts(db)[-1]
    assert reactions_after(db, JID) == [] and list_changes(db, chat_jid=JID) == []
    Deliverer(db, team, registry).deliver_due()
    assert slack.reactions == {}


def test_the_stream_sends_each_reaction_once_and_again_after_a_reset(
    db: Database, team: Settings, registry: ChannelRegistry, fakes: Platforms
) -> None:
    slack, _ = fakes
    _from_slack(db, team, slack, "first")
    _from_slack(db, team, slack, "second")
    stream = ChatStream(db, JID, 0)
    assert [f for f in stream.poll() if f.event == "reaction"] == []
    _run(team, db, registry, ReactEvent(emoji="👀", nth_last=2), ReactEvent(emoji="🔥"))
    first, second = [m for m in get_messages_after(JID, 0, db=db) if m.message_type == "user"]
    frames = [json.loads(f.data) for f in stream.poll(woken=True) if f.event == "reaction"]
    assert [(f["message_seq"], f["emoji"]) for f in frames] == [(first.seq, "👀"), (second.seq, "🔥")]
    assert [f for f in stream.poll(woken=True) if f.event == "reaction"] == []  # once
    truncate_after(db, team, JID, first.id)  # the history changes: the page starts over
    again = stream.poll(woken=True)
    assert again[0].event == "reset"
    assert [json.loads(f.data)["emoji"] for f in again if f.event == "reaction"] == ["👀", "🔥"]
