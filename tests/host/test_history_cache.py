"""A worker's kept history gives a run the same history as a fresh read, whatever changed.

The cache (orchestrator/run/history_cache.py) is only right while the group's
``history_rev`` moves with every change to a stored row and every deletion:
the database's triggers (revision 0027), checked here on both databases.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import pytest
from sqlalchemy import delete, text, update

from orchestrator.core.settings import Settings
from orchestrator.model.messages import SENDER_THINKING, StoredMessage
from orchestrator.run.assembly import Batch, plan_batch, prior_messages
from orchestrator.run.history_cache import HistoryCache, KeptHistory
from orchestrator.store.db import Database
from orchestrator.store.groups import Group, add_group, get_group
from orchestrator.store.history import edit_message, truncate_after
from orchestrator.store.message_log import get_messages_after, store_message_direct
from orchestrator.store.tables import GroupRow, MessageRow
from orchestrator.store.traces import record_trace

JID = "team@local"
WANTED = 6  # small, so that the kept rows are cut and read again across a page


@dataclass
class Chat:
    db: Database
    settings: Settings
    cache: HistoryCache
    n: int = 0

    def store(self, content: str, *, sender: str = "alice", mine: bool = False, kind: str = "user") -> StoredMessage:
        self.n += 1
        return store_message_direct(
            db=self.db,
            id=f"m{self.n}",
            chat_jid=JID,
            sender=sender,
            sender_name="Alice" if not mine else "Andy",
            content=content,
            timestamp=f"2026-11-28T10:{self.n // 60:02d}:{self.n % 60:02d}+00:00",
            is_from_me=mine,
            message_type=kind,
        )

    def group(self) -> Group:
        return get_group(self.db, JID)

    def batch(self, group: Group) -> Batch:
        planned = plan_batch(get_messages_after(JID, group.cursor_seq, db=self.db))
        assert isinstance(planned, Batch)
        return planned

    def prior(self) -> list[StoredMessage]:
        """The history a run now sees through the cache, checked against a fresh read."""
        group = self.group()
        batch = self.batch(group)
        kept = prior_messages(self.db, self.settings, group, batch, group.cursor_seq, self.cache)
        fresh = prior_messages(self.db, self.settings, group, batch, group.cursor_seq)
        assert [m.model_dump() for m in kept] == [m.model_dump() for m in fresh]
        return kept

    def run(self, reply: str) -> list[StoredMessage]:
        """A run over the pending messages: its history, then its outputs and the cursor moved."""
        prior = self.prior()
        cursor_to = self.batch(self.group()).cursor_to
        self.store("hmm", sender=SENDER_THINKING, mine=True, kind="assistant")  # stored only: not counted
        self.store(reply, sender="bot", mine=True, kind="assistant")
        with self.db.write() as s:
            s.execute(update(GroupRow).where(GroupRow.chat_jid == JID).values(cursor_seq=cursor_to))
        return prior


@pytest.fixture
def chat(db: Database, settings: Settings) -> Chat:
    add_group(db, chat_jid=JID, name="Team", folder="team")
    return Chat(db, settings.replace(context_messages=WANTED), HistoryCache(8))


def _rev(db: Database) -> int:
    return get_group(db, JID).history_rev


@contextlib.contextmanager
def reads_of_messages(db: Database) -> Iterator[list[str]]:
    """The statements that read the messages table while the block runs (the run path's
    reads are fixed SQL on the driver: counted where the store sends them)."""
    seen: list[str] = []
    real = db.read_fixed

    def counted(sql: str, *args: Any, **kwargs: Any) -> Any:
        if "FROM messages" in sql:
            seen.append(sql)
        return real(sql, *args, **kwargs)

    db.read_fixed = counted  # type: ignore[method-assign]
    try:
        yield seen
    finally:
        del db.read_fixed


def test_runs_see_the_same_history_through_the_cache_as_read_fresh(chat: Chat) -> None:
    shown = []
    for i in range(12):  # past WANTED: the kept rows are cut, old ones leave the window
        chat.store(f"question {i}")
        if i % 3 == 0:
            chat.store(f"and another {i}")  # a batch of two
        shown.append(chat.run(f"answer {i}"))
    assert len(chat.cache) == 1
    assert sum(1 for m in shown[-1] if m.sender != SENDER_THINKING) == WANTED
    # The cursor ends at a run's batch: its outputs come with the next batch, then are history.
    assert [m.content for m in shown[-1][-3:]] == ["hmm", "answer 9", "question 10"]
    # The next run's history is the kept rows (the last run's and its batch): nothing read.
    chat.store("one more")
    group = chat.group()
    batch = chat.batch(group)
    with reads_of_messages(chat.db) as reads:
        prior_messages(chat.db, chat.settings, group, batch, group.cursor_seq, chat.cache)
    assert reads == []
    # Rows stored between the kept ones and the cursor (a batch that went without a run): one read.
    with chat.db.write() as s:
        s.execute(update(GroupRow).where(GroupRow.chat_jid == JID).values(cursor_seq=batch.cursor_to))
    chat.store("and one more")
    group = chat.group()
    with reads_of_messages(chat.db) as reads:
        kept = prior_messages(chat.db, chat.settings, group, chat.batch(group), group.cursor_seq, chat.cache)
    assert len(reads) == 1 and kept[-1].content == "one more"
    without = HistoryCache(0)
    with reads_of_messages(chat.db) as reads:
        prior_messages(chat.db, chat.settings, group, chat.batch(group), group.cursor_seq, without)
    assert len(reads) >= 1 and len(without) == 0


def test_an_edit_a_supersede_and_a_deletion_are_seen_through_the_cache(chat: Chat, settings: Settings) -> None:
    first = chat.store("what is 2 + 2?")
    chat.run("5")
    chat.store("are you sure?")
    chat.run("yes")
    # A person's edit of a kept message: the next run shows the new words.
    before = _rev(chat.db)
    edit_message(chat.db, settings, JID, first.id, "what is 2 + 3?")
    assert _rev(chat.db) > before
    chat.store("well?")
    assert [m.content for m in chat.run("5, as asked")][0] == "what is 2 + 3?"
    # A kept message superseded (truncate): gone from the next run's history.
    chat.store("forget that")
    chat.run("forgotten")
    cut = next(m for m in get_messages_after(JID, 0, db=chat.db) if m.content == "well?")
    truncate_after(chat.db, settings, JID, cut.id)
    with chat.db.write() as s:  # the truncate's rewind, as a rerun would leave it
        s.execute(update(GroupRow).where(GroupRow.chat_jid == JID).values(cursor_seq=cut.seq))
    chat.store("after the cut")
    assert "forget that" not in [m.content for m in chat.run("noted")]
    # A kept message deleted (a retention prune): gone from the next run's history.
    chat.store("next")
    chat.run("ok")
    before = _rev(chat.db)
    with chat.db.write() as s:
        s.execute(delete(MessageRow).where(MessageRow.chat_jid == JID, MessageRow.content == "noted"))
    assert _rev(chat.db) > before
    chat.store("and now?")
    assert "noted" not in [m.content for m in chat.run("now")]


def test_only_a_change_to_what_a_run_sees_moves_the_revision(chat: Chat) -> None:
    asked = chat.store("hello")
    before = _rev(chat.db)
    chat.run("hi")  # new rows, the cursor: not a change to a stored row
    with chat.db.write() as s:
        record_trace(s, asked.seq, "00-" + "a" * 32 + "-" + "b" * 16 + "-01")
    assert _rev(chat.db) == before
    with chat.db.write() as s:
        s.execute(update(MessageRow).where(MessageRow.seq == asked.seq).values(sender_name="Alice B."))
    assert _rev(chat.db) == before + 1
    # A kept row changed behind the cache's back by any writer is read again.
    chat.store("still there?")
    assert [m.sender_name for m in chat.run("yes")][0] == "Alice B."


def test_the_triggers_are_at_the_head(db: Database) -> None:
    # A migration that rebuilds the messages table on SQLite drops them: it must make them again.
    query = (
        "SELECT name FROM sqlite_master WHERE type = 'trigger'"
        if db.is_sqlite
        else "SELECT tgname FROM pg_trigger WHERE NOT tgisinternal"
    )
    with db.read() as s:
        names = set(s.execute(text(query)).scalars())
    assert {"messages_history_changed", "messages_history_deleted"} <= names


def test_a_view_column_can_still_change_type(chat: Chat) -> None:
    # PostgreSQL refuses to alter a column a trigger names (``UPDATE OF``): an operator's
    # collation or a later migration must not have to drop the triggers to do it.
    asked = chat.store("hello")
    if not chat.db.is_sqlite:
        with chat.db.write() as s:
            s.execute(text('ALTER TABLE messages ALTER COLUMN "timestamp" TYPE text COLLATE "C"'))
            s.execute(text("ALTER TABLE messages ALTER COLUMN content TYPE text"))
    before = _rev(chat.db)
    with chat.db.write() as s:
        s.execute(update(MessageRow).where(MessageRow.seq == asked.seq).values(content="hello"))
    # Written but not changed: PostgreSQL compares (SQLite's trigger fires on the column named).
    assert _rev(chat.db) == before + (1 if chat.db.is_sqlite else 0)
    with chat.db.write() as s:
        s.execute(update(MessageRow).where(MessageRow.seq == asked.seq).values(content="hello!", meta={"k": 1}))
    assert _rev(chat.db) > before


def test_the_cache_keeps_the_most_recently_run_groups() -> None:
    cache = HistoryCache(2)
    for jid in ("a", "b", "c"):
        cache.keep(jid, KeptHistory(rev=0, upto=5, rows=[], complete=True, wanted=WANTED))
    assert len(cache) == 2 and cache.get("a", 0, 5, WANTED) is None
    assert cache.get("b", 0, 5, WANTED) is not None
    # Another revision, an earlier cursor or another window: read afresh.
    assert cache.get("c", 1, 5, WANTED) is None and cache.get("c", 0, 5, WANTED) is None
    cache.keep("b", KeptHistory(rev=0, upto=5, rows=[], complete=True, wanted=WANTED))
    assert cache.get("b", 0, 4, WANTED) is None
    cache.keep("b", KeptHistory(rev=0, upto=5, rows=[], complete=True, wanted=WANTED))
    assert cache.get("b", 0, 6, WANTED + 1) is None
    assert len(HistoryCache(0)) == 0
