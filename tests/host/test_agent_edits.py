"""The agent edits its own earlier messages (``edit_message``; issue 34 item 4), decided on
the host through runs of the pipeline with the fake sandbox, on both databases: its latest
(or nth-last) reply changes with the old words kept and the channels that showed it get an
update; nothing of another's, nor a superseded reply; the tool off in the profile refuses;
a replay changes nothing."""

from __future__ import annotations

import pytest

from agent_runner.protocol import AssistantEvent, EditEvent, Event, ResultEvent, Usage
from fakes.clock import FakeClock
from fakes.sandbox import FakeSandbox, Script
from orchestrator.core.settings import Settings
from orchestrator.run.ingest import IncomingMessage, ingest
from orchestrator.run.outbound import ChannelRegistry
from orchestrator.run.pipeline import Pipeline
from orchestrator.run.profile import change_profile
from orchestrator.store.db import Database
from orchestrator.store.groups import add_group
from orchestrator.store.history import EDIT_HISTORY_KEY
from orchestrator.store.message_log import get_messages_after

TEAM = "team@g.us"


@pytest.fixture(autouse=True)
def group(db: Database) -> None:
    add_group(db, chat_jid=TEAM, name="team", folder="team", requires_trigger=False)


def run(
    settings: Settings, db: Database, *events: Event, said: str = "go", channels: ChannelRegistry | None = None
) -> None:
    ingest(db, settings, IncomingMessage(chat_jid=TEAM, sender="u", content=said), signal=None)
    sandbox = FakeSandbox(Script([*events, ResultEvent(usage=Usage())]))
    Pipeline(settings, db, channels or ChannelRegistry([]), sandbox, clock=FakeClock()).drain_group(TEAM)


def replies(db: Database) -> list[str]:
    return [m.content for m in get_messages_after(TEAM, 0, db=db) if m.sender == "bot"]


def hosts(db: Database) -> list[str]:
    return [m.content for m in get_messages_after(TEAM, 0, db=db) if m.message_type == "host"]


def test_the_agent_turns_working_on_it_into_the_result(settings: Settings, db: Database) -> None:
    run(settings, db, AssistantEvent(text="working on it"), AssistantEvent(text="second note"))
    run(settings, db, EditEvent(text="done: 42", nth_last=2))
    assert replies(db) == ["done: 42", "second note"]
    (edited,) = [m for m in get_messages_after(TEAM, 0, db=db) if m.content == "done: 42"]
    assert edited.edited_at is not None
    (before,) = edited.metadata[EDIT_HISTORY_KEY]  # type: ignore[index]
    assert before["content"] == "working on it" and before["by_run"]
    run(settings, db, EditEvent(text="latest, fixed"))
    assert replies(db) == ["done: 42", "latest, fixed"] and hosts(db) == []


def test_what_it_may_not_edit_is_refused_in_the_chat(settings: Settings, db: Database) -> None:
    run(settings, db, EditEvent(text="nothing to edit yet"))
    assert hosts(db) == ["🚫 edit_message refused: you have no message 1 back in this chat to edit"]
    run(settings, db, AssistantEvent(text="only one"))
    run(settings, db, EditEvent(text="too far", nth_last=2), EditEvent(text=" ", nth_last=1))
    assert hosts(db)[1:] == [
        "🚫 edit_message refused: you have no message 2 back in this chat to edit",
        "🚫 edit_message refused: the new words are empty or over 20000 characters",
    ]
    assert replies(db) == ["only one"]
    change_profile(db, settings, TEAM, {"tools": ["send_message"]})
    run(settings, db, EditEvent(text="sneaky"))
    assert replies(db) == ["only one"] and "message_changes is not among this group's tools" in hosts(db)[-1]
    # A person's message is never the agent's to edit.
    assert all(m.content != "sneaky" for m in get_messages_after(TEAM, 0, db=db))


def test_the_channel_that_showed_it_shows_the_new_words_in_place(settings: Settings, db: Database) -> None:
    from fakes.platforms import fake_platforms, pointed_at
    from orchestrator.channels.slack import SlackChannel
    from orchestrator.store.attachments import attach_channel
    from tests.conftest import wait_until

    with fake_platforms() as fakes:
        slack, _ = fakes
        s = pointed_at(settings, fakes)
        attach_channel(db, TEAM, "slack", address="C0TEAM0001")
        channels = ChannelRegistry([SlackChannel(s, db=db)])
        try:
            run(s, db, AssistantEvent(text="working on it"), channels=channels)
            (post,) = [p for p in slack.live_posts("C0TEAM0001") if "working on it" in p.text]
            run(s, db, EditEvent(text="done: 42"), channels=channels)
            wait_until(lambda: post.updates == 1, 10, "the post updated")
        finally:
            channels.close()
    assert "done: 42" in post.text and not post.deleted
