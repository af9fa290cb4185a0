"""A group's agent edits only what its own runs said in its chat (issue 44, finding 1), through
runs of the pipeline with the fake sandbox, on both databases: what the main group's agent
posted into the group's chat (``send_message``, ``from_chat``) is neither changed nor counted
by the group's ``edit_message``, and neither is a reply no run of the group stored."""

from __future__ import annotations

import pytest

from agent_runner.protocol import AssistantEvent, EditEvent, Event, SendMessageEvent
from orchestrator.core.settings import Settings
from orchestrator.model.messages import SENDER_BOT, NewMessage
from orchestrator.store.db import Database
from orchestrator.store.message_log import get_messages_after, insert_message, now_iso
from tests.host.agent_runs import MAIN, TEAM, main_and_team, play


@pytest.fixture(autouse=True)
def groups(db: Database) -> None:
    main_and_team(db)


def run(settings: Settings, db: Database, jid: str, *events: Event) -> None:
    play(settings, db, jid, *events, content="@Andy go")


def bot_lines(db: Database) -> list[tuple[str, object]]:
    return [
        (m.content, (m.metadata or {}).get("from_chat"))
        for m in get_messages_after(TEAM, 0, db=db)
        if m.sender == "bot"
    ]


def hosts(db: Database) -> list[str]:
    return [m.content for m in get_messages_after(TEAM, 0, db=db) if m.message_type == "host"]


def test_the_main_groups_post_in_a_groups_chat_is_not_the_groups_to_edit(settings: Settings, db: Database) -> None:
    run(settings, db, MAIN, SendMessageEvent(chat_jid=TEAM, text="maintenance tonight at 22:00 (ops)"))
    assert bot_lines(db) == [("maintenance tonight at 22:00 (ops)", MAIN)]
    run(settings, db, TEAM, EditEvent(text="maintenance cancelled", nth_last=1))
    assert bot_lines(db) == [("maintenance tonight at 22:00 (ops)", MAIN)]
    assert hosts(db) == ["🚫 edit_message refused: you have no message 1 back in this chat to edit"]
    # With replies of its own before and after it, the group's nth_last counts only its own:
    # 1 is its latest, 2 the one before the main group's post, never the post.
    run(settings, db, TEAM, AssistantEvent(text="own first"))
    run(settings, db, MAIN, SendMessageEvent(chat_jid=TEAM, text="second notice (ops)"))
    run(settings, db, TEAM, AssistantEvent(text="own second"))
    run(settings, db, TEAM, EditEvent(text="own first, edited", nth_last=2), EditEvent(text="own second, edited"))
    assert bot_lines(db) == [
        ("maintenance tonight at 22:00 (ops)", MAIN),
        ("own first, edited", None),
        ("second notice (ops)", MAIN),
        ("own second, edited", None),
    ]


def test_a_reply_no_run_of_the_group_stored_is_not_its_to_edit(settings: Settings, db: Database) -> None:
    """A bot message with no run of this group behind it (imported history, a forged run id)."""
    for n, run_id in enumerate([None, "no-such-run"]):
        meta = {} if run_id is None else {"run_id": run_id}
        new = NewMessage(
            id=f"imported-{n}",
            chat_jid=TEAM,
            sender=SENDER_BOT,
            sender_name="Andy",
            content=f"imported {n}",
            timestamp=now_iso(),
            is_from_me=True,
            message_type="assistant",
            metadata=meta,
        )
        with db.write() as session:
            insert_message(session, db, new)
    run(settings, db, TEAM, EditEvent(text="rewritten"))
    assert [text for text, _ in bot_lines(db)] == ["imported 0", "imported 1"]
    assert hosts(db) == ["🚫 edit_message refused: you have no message 1 back in this chat to edit"]
