"""Edit, regenerate, truncate: superseded messages are kept but leave both views."""

from __future__ import annotations

from dataclasses import dataclass

import pytest
from sqlalchemy import update

from orchestrator.core.errors import GroupBusy, InvalidMessage, InvalidMessageMetadata, MessageNotFound
from orchestrator.core.settings import Settings
from orchestrator.model.messages import StoredMessage
from orchestrator.model.views import REPLY_TO_KEY, RUN_ID_KEY, format_messages_for_sdk
from orchestrator.store import leases
from orchestrator.store.db import Database
from orchestrator.store.groups import add_group, get_group
from orchestrator.store.history import EDIT_HISTORY_KEY, edit_message, regenerate, truncate_after
from orchestrator.store.message_log import get_messages_after, store_message_direct
from orchestrator.store.runs import create_run
from orchestrator.store.tables import GroupRow

JID = "team@local"


class Signals(list[str]):
    def __call__(self, jid: str) -> None:
        self.append(jid)


@dataclass
class Chat:
    db: Database
    n: int = 0

    def user(self, text: str, **meta: object) -> StoredMessage:
        self.n += 1
        return store_message_direct(
            db=self.db,
            id=f"u{self.n}",
            chat_jid=JID,
            sender="alice",
            sender_name="Alice",
            content=text,
            timestamp=f"2026-11-26T10:00:{self.n:02d}+00:00",
            metadata=meta or None,
        )

    def output(
        self, run_id: str, answered: int, text: str, *, sender: str = "bot", kind: str = "assistant"
    ) -> StoredMessage:
        self.n += 1
        return store_message_direct(
            db=self.db,
            id=f"{run_id}-{self.n}",
            chat_jid=JID,
            sender=sender,
            sender_name="Andy",
            content=text,
            timestamp=f"2026-11-26T10:00:{self.n:02d}+00:00",
            is_from_me=True,
            message_type=kind,
            metadata={REPLY_TO_KEY: answered, RUN_ID_KEY: run_id},
        )

    def answered(self, first: StoredMessage, last: StoredMessage, reply: str) -> tuple[str, list[StoredMessage]]:
        """What a run over first..last leaves behind: a run record, a tool call, its result, a reply."""
        run = create_run(self.db, chat_jid=JID, cursor_from=first.seq - 1, cursor_to=last.seq, celery_task_id=None)
        with self.db.write() as s:
            s.execute(
                update(GroupRow).where(GroupRow.chat_jid == JID).values(cursor_seq=last.seq, pending_seq=last.seq)
            )
        outs = [
            self.output(run.id, last.seq, "bash: ls", sender="tool_use"),
            self.output(run.id, last.seq, "a.txt", sender="command_output", kind="tool_result"),
            self.output(run.id, last.seq, reply),
        ]
        return run.id, outs


@pytest.fixture
def chat(db: Database) -> Chat:
    add_group(db, chat_jid=JID, name="Team", folder="team", requires_trigger=False)
    return Chat(db)


def _contents(db: Database) -> list[str]:
    # What GET /api/chats/{jid}/messages serves: the live messages, in seq order.
    return [m.content for m in get_messages_after(JID, 0, db=db)]


def test_edit_replaces_text_and_keeps_the_previous_one(db: Database, settings: Settings, chat: Chat) -> None:
    m = chat.user("what is 2+2?")
    changed = edit_message(db, settings, JID, m.id, "what is 3+3?")
    assert changed.message.content == "what is 3+3?"
    assert changed.message.edited_at is not None
    assert [e["content"] for e in changed.message.metadata[EDIT_HISTORY_KEY]] == ["what is 2+2?"]
    edit_message(db, settings, JID, m.id, "what is 4+4?")
    stored = get_messages_after(JID, 0, db=db)[0]
    assert stored.content == "what is 4+4?"
    assert [e["content"] for e in stored.metadata[EDIT_HISTORY_KEY]] == ["what is 2+2?", "what is 3+3?"]
    assert [s.content for s in format_messages_for_sdk([stored])] == ["what is 4+4?"]
    assert not changed.rerun and changed.superseded == []


def test_edit_refuses_what_it_cannot_edit(db: Database, settings: Settings, chat: Chat) -> None:
    u = chat.user("hi")
    _, (_, _, reply) = chat.answered(u, u, "hello")
    with pytest.raises(InvalidMessage, match="only a person's message"):
        edit_message(db, settings, JID, reply.id, "forged")
    with pytest.raises(MessageNotFound):
        edit_message(db, settings, JID, "nope", "x")
    with pytest.raises(InvalidMessage, match="NUL"):
        edit_message(db, settings, JID, u.id, "a\x00b")
    truncate_after(db, settings, JID, u.id)
    with pytest.raises(InvalidMessage, match="superseded"):
        edit_message(db, settings, JID, reply.id, "x")
    assert _contents(db) == ["hi"]


def test_edit_with_bad_context_changes_nothing(db: Database, settings: Settings, chat: Chat) -> None:
    m = chat.user("read this")
    with pytest.raises(InvalidMessageMetadata) as err:
        edit_message(db, settings, JID, m.id, "read that", context=[{"type": "file"}])
    assert err.value.field == "metadata.context[0].path"
    stored = get_messages_after(JID, 0, db=db)[0]
    assert stored.content == "read this" and stored.metadata is None and stored.edited_at is None


def test_edit_with_rerun_supersedes_what_followed_and_asks_again(db: Database, settings: Settings, chat: Chat) -> None:
    u1 = chat.user("first")
    chat.answered(u1, u1, "answer one")
    u2 = chat.user("second")
    _, outs = chat.answered(u2, u2, "answer two")
    signals = Signals()
    changed = edit_message(db, settings, JID, u1.id, "first, edited", rerun=True, signal=signals)
    assert signals == [JID]
    assert changed.rerun
    # everything after the edited message is superseded, kept for audit
    assert changed.superseded == [m.seq for m in get_messages_after(JID, u1.seq, include_superseded=True, db=db)]
    assert _contents(db) == ["first, edited"]
    group = get_group(db, JID)
    assert group.cursor_seq < u1.seq <= group.pending_seq
    assert [m.id for m in get_messages_after(JID, group.cursor_seq, db=db)] == [u1.id]


def test_regenerate_supersedes_the_reply_its_run_and_what_followed(
    db: Database, settings: Settings, chat: Chat
) -> None:
    u1 = chat.user("one")
    chat.answered(u1, u1, "reply one")
    u2 = chat.user("two")
    u3 = chat.user("three")
    run_id, (tool_use, tool_result, reply) = chat.answered(u2, u3, "reply two")
    later = chat.user("four")
    signals = Signals()

    changed = regenerate(db, settings, JID, reply.id, signal=signals)

    assert signals == [JID] and changed.rerun
    assert changed.superseded == [tool_use.seq, tool_result.seq, reply.seq, later.seq]
    assert _contents(db) == ["one", "bash: ls", "a.txt", "reply one", "two", "three"]
    group = get_group(db, JID)
    # the next run gets the same batch the regenerated run answered
    assert [m.id for m in get_messages_after(JID, group.cursor_seq, db=db)] == [u2.id, u3.id]
    assert group.pending_seq == u3.seq
    # superseded rows are still there for audit
    audit = get_messages_after(JID, 0, include_superseded=True, db=db)
    assert {m.id for m in audit if m.superseded_at is not None} == {tool_use.id, tool_result.id, reply.id, later.id}
    assert run_id in reply.id


def test_regenerate_without_a_run_record_answers_the_last_input(db: Database, settings: Settings, chat: Chat) -> None:
    u = chat.user("imported question")
    reply = store_message_direct(
        db=db,
        id="r-imported",
        chat_jid=JID,
        sender="bot",
        sender_name="Andy",
        content="old answer",
        timestamp="2026-11-26T11:00:00+00:00",
        is_from_me=True,
        message_type="assistant",
    )
    regenerate(db, settings, JID, reply.id)
    group = get_group(db, JID)
    assert [m.id for m in get_messages_after(JID, group.cursor_seq, db=db)] == [u.id]


def test_regenerate_refuses_non_replies(db: Database, settings: Settings, chat: Chat) -> None:
    u = chat.user("q")
    _, (tool_use, _, _) = chat.answered(u, u, "a")
    with pytest.raises(InvalidMessage, match="only an assistant reply"):
        regenerate(db, settings, JID, u.id)
    with pytest.raises(InvalidMessage, match="only an assistant reply"):
        regenerate(db, settings, JID, tool_use.id)  # stored-only record, never shown to the model
    assert len(_contents(db)) == 4


def test_history_changes_wait_for_a_running_agent(db: Database, settings: Settings, chat: Chat) -> None:
    u = chat.user("q")
    _, (_, _, reply) = chat.answered(u, u, "a")
    assert leases.acquire(db, JID, "worker-1", 60)
    with pytest.raises(GroupBusy, match="in progress"):
        regenerate(db, settings, JID, reply.id)
    with pytest.raises(GroupBusy):
        truncate_after(db, settings, JID, u.id)
    with pytest.raises(GroupBusy):
        edit_message(db, settings, JID, u.id, "changed", rerun=True)
    assert _contents(db) == ["q", "bash: ls", "a.txt", "a"]
    assert get_group(db, JID).cursor_seq == u.seq
    leases.release(db, JID, "worker-1")
    regenerate(db, settings, JID, reply.id)
    assert _contents(db) == ["q"]


def test_truncate_after_hides_the_rest_from_both_views(db: Database, settings: Settings, chat: Chat) -> None:
    u1 = chat.user("keep me")
    chat.answered(u1, u1, "kept reply")
    u2 = chat.user("drop me")
    chat.answered(u2, u2, "dropped reply")
    keep = get_messages_after(JID, 0, db=db)[3]
    changed = truncate_after(db, settings, JID, keep.id)
    assert len(changed.superseded) == 4 and not changed.rerun
    assert _contents(db) == ["keep me", "bash: ls", "a.txt", "kept reply"]
    everything = get_messages_after(JID, 0, include_superseded=True, db=db)
    assert [m.content for m in format_messages_for_sdk(everything)] == ["keep me", "a.txt", "kept reply"]
    group = get_group(db, JID)
    assert group.cursor_seq <= keep.seq and group.pending_seq <= keep.seq
