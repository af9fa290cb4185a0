"""Ingest: store, decide, mark pending, signal only after commit; chats that are no
registered group bounded (how many, and each one's newest messages)."""

from __future__ import annotations

import logging
import queue
import random
import threading
import time

import pytest

from fakes.sandbox import FakeSandbox, Script
from orchestrator.core.errors import InvalidMessage, StoreError
from orchestrator.core.settings import Settings
from orchestrator.run.ingest import IncomingMessage, IngestResult, ingest, ingest_batch
from orchestrator.run.outbound import ChannelRegistry
from orchestrator.run.pipeline import Pipeline
from orchestrator.run.router import has_trigger
from orchestrator.store.db import Database
from orchestrator.store.groups import add_group, ensure_main_group, get_group
from orchestrator.store.message_log import get_messages_after
from tests.conftest import run_in_threads


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("@Andy what's the weather?", True),
        ("@andy help me", True),
        ("Hey @Andy", False),
        ("What's up?", False),
        ("@Andyx no", False),
        ("@ghost hi", True),
    ],
)
def test_trigger_at_start_case_insensitive(text: str, expected: bool) -> None:
    assert has_trigger(text, ["Andy", "ghost"]) is expected


class Signals:
    def __init__(self, db: Database) -> None:
        self.db = db
        self.calls: list[tuple[str, int]] = []

    def __call__(self, jid: str) -> None:
        # Record what a worker would see at signal time: the commit must be done.
        self.calls.append((jid, len(get_messages_after(jid, 0, db=self.db))))


def test_main_group_wakes_on_any_user_message(db: Database, settings: Settings) -> None:
    ensure_main_group(db)
    sig = Signals(db)
    r = ingest(db, settings, IncomingMessage(chat_jid="main@local", sender="u", content="hi"), signal=sig)
    assert r.created and r.triggered and r.signalled
    assert sig.calls == [("main@local", 1)]  # the message was committed before the signal
    assert get_group(db, "main@local").pending_seq == r.message.seq


def test_trigger_group_needs_the_name(db: Database, settings: Settings) -> None:
    add_group(db, chat_jid="team@g.us", name="team", folder="team")
    sig = Signals(db)
    quiet = ingest(db, settings, IncomingMessage(chat_jid="team@g.us", sender="u", content="just chatting"), signal=sig)
    loud = ingest(db, settings, IncomingMessage(chat_jid="team@g.us", sender="u", content="@andy look"), signal=sig)
    assert not quiet.triggered and loud.triggered
    assert [c[0] for c in sig.calls] == ["team@g.us"]
    # The quiet one is stored and becomes context for the next run.
    assert [m.content for m in get_messages_after("team@g.us", 0, db=db)] == ["just chatting", "@andy look"]


def test_unregistered_chat_is_stored_never_processed(db: Database, settings: Settings) -> None:
    sig = Signals(db)
    r = ingest(db, settings, IncomingMessage(chat_jid="stranger@g.us", sender="u", content="@Andy hi"), signal=sig)
    assert r.created and not r.triggered and sig.calls == []
    assert len(get_messages_after("stranger@g.us", 0, db=db)) == 1


def test_duplicate_ingest_stores_once_and_triggers_once(db: Database, settings: Settings) -> None:
    ensure_main_group(db)
    sig = Signals(db)
    msg = IncomingMessage(id="dup-1", chat_jid="main@local", sender="u", content="hi")
    first = ingest(db, settings, msg, signal=sig)
    second = ingest(db, settings, msg, signal=sig)
    assert first.created and not second.created and not second.triggered
    assert len(sig.calls) == 1


def test_invalid_metadata_is_refused_and_nothing_signalled(db: Database, settings: Settings) -> None:
    ensure_main_group(db)
    sig = Signals(db)
    with pytest.raises(InvalidMessage):
        ingest(
            db,
            settings,
            IncomingMessage(chat_jid="main@local", sender="u", content="x", timestamp="not a date"),
            signal=sig,
        )
    assert sig.calls == [] and get_messages_after("main@local", 0, db=db) == []


def test_group_folder_must_be_a_slug(db: Database) -> None:
    for bad in ("../etc", "/abs", "a/b", "", ".hidden"):
        with pytest.raises(InvalidMessage):
            add_group(db, chat_jid=f"x{bad}@g", name="x", folder=bad)
    add_group(db, chat_jid="ok@g", name="ok", folder="ok-1")
    with pytest.raises(StoreError):
        add_group(db, chat_jid="ok2@g", name="ok", folder="ok-1")


def test_broker_down_loses_nothing(db: Database, settings: Settings) -> None:
    ensure_main_group(db)

    def broken(_: str) -> None:
        raise ConnectionError("broker unreachable")

    r = ingest(db, settings, IncomingMessage(chat_jid="main@local", sender="u", content="hi"), signal=broken)
    assert r.created and r.triggered and not r.signalled
    group = get_group(db, "main@local")
    assert group.pending_seq == r.message.seq > group.cursor_seq  # the sweeper will re-signal it


def test_only_an_idle_group_is_signalled(db: Database, settings: Settings) -> None:
    ensure_main_group(db)
    sig = Signals(db)

    def send(text: str) -> bool:
        return ingest(
            db, settings, IncomingMessage(chat_jid="main@local", sender="u", content=text), signal=sig
        ).signalled

    # The first message wakes the group; the next ones find work already
    # pending, whose signal (or the worker draining it) covers them too.
    assert [send("a"), send("b"), send("c")] == [True, False, False]
    group = get_group(db, "main@local")
    assert group.pending_seq == max(m.seq for m in get_messages_after("main@local", 0, db=db))
    # Once a run has taken everything, the group is idle again.
    with db.write() as session:
        from orchestrator.store.tables import GroupRow

        session.get(GroupRow, "main@local").cursor_seq = group.pending_seq  # type: ignore[union-attr]
    assert send("d") is True
    assert [c[0] for c in sig.calls] == ["main@local", "main@local"]


def test_a_batch_is_one_transaction_and_a_bad_message_fails_alone(db: Database, settings: Settings) -> None:
    """ingest_batch (the API's group commit): the messages in order, one COMMIT for all, each
    signalled as ingest would; a message the store refuses is answered with its error and
    the others are stored all the same, none twice."""
    from sqlalchemy import event

    ensure_main_group(db)
    signalled: list[str] = []  # no database read in it: every COMMIT counted is ingest's
    commits: list[int] = []

    def counted(_conn: object) -> None:
        commits.append(1)

    event.listen(db.engine, "commit", counted)
    try:
        batch = [IncomingMessage(id=f"b{i}", chat_jid="main@local", sender="u", content=f"m{i}") for i in range(4)]
        results = ingest_batch(db, settings, batch, signal=signalled.append)
        assert len(commits) == 1
        assert all(isinstance(r, IngestResult) for r in results)
        assert [r.message.id for r in results] == ["b0", "b1", "b2", "b3"]  # type: ignore[union-attr]
        seqs = [r.message.seq for r in results]  # type: ignore[union-attr]
        assert seqs == sorted(seqs) and len(set(seqs)) == 4
        assert [r.signalled for r in results] == [True, False, False, False]  # type: ignore[union-attr]
        # The same ids again (a client's retry) and one the store refuses, mid-batch.
        again = [
            *batch[:2],
            IncomingMessage(chat_jid="main@local", sender="u", content="x", timestamp="no date"),
            IncomingMessage(id="b4", chat_jid="main@local", sender="u", content="m4"),
        ]
        results = ingest_batch(db, settings, again, signal=signalled.append)
    finally:
        event.remove(db.engine, "commit", counted)
    assert isinstance(results[2], InvalidMessage)
    assert [r.created for r in (results[0], results[1], results[3])] == [False, False, True]  # type: ignore[union-attr]
    assert [m.id for m in get_messages_after("main@local", 0, db=db)] == ["b0", "b1", "b2", "b3", "b4"]
    assert signalled == ["main@local"]


class _ConsumingPipeline(Pipeline):
    """The real drain loop (lease, re-check after each run and after release)
    around a "run" that just takes every message after the cursor."""

    def run_once(self, group, *, task_id=None, lease_lost=None):  # type: ignore[no-untyped-def]
        new = get_messages_after(group.chat_jid, group.cursor_seq, db=self.db)
        time.sleep(random.uniform(0, 0.004))  # messages keep arriving meanwhile
        self._advance(group, new[-1].seq if new else group.pending_seq, None)
        return None


def test_no_message_waits_for_the_sweeper_when_signals_are_skipped(db: Database, settings: Settings) -> None:
    """Messages arrive while workers drain the group, finish runs and let go
    of the lease: every one is consumed through the signals ingest sent
    (one per idle -> pending transition), none is left for the sweeper."""
    ensure_main_group(db)
    signals: queue.Queue[str] = queue.Queue()
    sent = stored = 0
    done = threading.Event()

    def worker(_: int) -> None:
        # A fake sandbox: no run starts here, but a step's recovery check asks for one (no Docker).
        pipeline = _ConsumingPipeline(settings, db, ChannelRegistry(), sandbox=FakeSandbox(Script()))
        while not (done.is_set() and signals.empty()):
            try:
                jid = signals.get(timeout=0.02)
            except queue.Empty:
                continue
            pipeline.drain_group(jid)

    threads = [threading.Thread(target=worker, args=(i,)) for i in range(2)]
    for t in threads:
        t.start()
    try:
        for burst in range(50):  # bursts, and pauses about as long as a run
            for i in range(random.randint(1, 4)):
                stored += 1
                if ingest(
                    db,
                    settings,
                    IncomingMessage(chat_jid="main@local", sender="u", content=f"m{burst}.{i}"),
                    signal=signals.put,
                ).signalled:
                    sent += 1
                time.sleep(random.uniform(0, 0.001))
            time.sleep(random.uniform(0, 0.008))
    finally:
        done.set()
        for t in threads:
            t.join(timeout=60)
    group = get_group(db, "main@local")
    last = max(m.seq for m in get_messages_after("main@local", 0, db=db))
    assert group.pending_seq == last
    assert group.cursor_seq == last, f"messages after #{group.cursor_seq} were left for the sweeper"
    assert 1 <= sent < stored


def test_a_sender_over_its_rate_in_a_batch_is_refused_once_and_counted_once(db: Database, settings: Settings) -> None:
    """The batch that meets the refusal is rolled back and tried again one by one: the sender's
    other message is stored, the refusal is its message's answer, and the refusal metric counts
    one refusal, not the batch's attempt too."""
    from prometheus_client import REGISTRY

    from orchestrator.core.errors import RateLimited

    def refusals() -> float:
        return REGISTRY.get_sample_value("orchestrator_sender_refusals_total") or 0.0

    ensure_main_group(db)
    limited = settings.replace(**{"sender_messages_per_minute": 1})
    before = refusals()
    batch = [IncomingMessage(id=f"r{i}", chat_jid="main@local", sender="u", content=f"m{i}") for i in range(2)]
    first, second = ingest_batch(db, limited, batch, signal=None)
    assert isinstance(first, IngestResult) and first.created
    assert isinstance(second, RateLimited)
    assert [m.id for m in get_messages_after("main@local", 0, db=db)] == ["r0"]
    assert refusals() - before == 1


# -- chats that are no registered group: bounded for every channel (issue 29) ------------------


def _chat_rows(db: Database, chat_jid: str) -> list[str]:
    return [m.content for m in get_messages_after(chat_jid, 0, db=db)]


def test_unregistered_chats_are_capped_and_each_keeps_its_newest_messages(
    db: Database, settings: Settings, caplog: pytest.LogCaptureFixture
) -> None:
    """At most ``unregistered_chats`` chats without a group are kept, each with its
    ``unregistered_chat_messages`` newest messages; a new chat past the cap stores nothing
    (refused, counted, logged once per chat); registered chats are never touched, and a chat
    registered later starts with its recent messages."""
    from prometheus_client import REGISTRY

    from orchestrator.core.errors import UnregisteredChatsFull

    def drops() -> float:
        return REGISTRY.get_sample_value("orchestrator_unregistered_messages_dropped_total") or 0.0

    s = settings.replace(**{"unregistered_chats": 3, "unregistered_chat_messages": 5})
    tag = f"{random.getrandbits(32):08x}"  # the log-once memory is the process's: chats new to it
    stray = [f"stray{i}-{tag}@x" for i in range(5)]
    ensure_main_group(db)

    def say(chat: str, text: str) -> IngestResult:
        return ingest(db, s, IncomingMessage(chat_jid=chat, sender="u", content=text), signal=None)

    for n in range(8):
        say("main@local", f"main {n}")
        for chat in stray[:3]:
            say(chat, f"{chat} {n}")
    for chat in stray[:3]:  # kept, with their 5 newest messages
        assert _chat_rows(db, chat) == [f"{chat} {n}" for n in range(3, 8)]
    assert len(_chat_rows(db, "main@local")) == 8  # a registered chat keeps everything

    before = drops()
    with caplog.at_level(logging.WARNING, logger="orchestrator.run.ingest"):
        for n in range(3):
            with pytest.raises(UnregisteredChatsFull, match="ORCHESTRATOR_UNREGISTERED_CHATS"):
                say(stray[3], f"dropped {n}")
    assert _chat_rows(db, stray[3]) == [] and drops() - before == 3
    assert len(caplog.records) == 1 and stray[3] in caplog.text
    say(stray[0], "a kept chat goes on")  # the chats kept are not refused

    # Registering a kept chat frees its place (and its recent messages are its context);
    # the fourth chat is taken then.  A registered chat is never pruned again.
    add_group(db, chat_jid=stray[0], name="s0", folder=f"s0-{tag}")
    assert _chat_rows(db, stray[0]) == [f"{stray[0]} {n}" for n in range(4, 8)] + ["a kept chat goes on"]
    assert say(stray[3], "taken now").created
    for n in range(6):
        say(stray[0], f"registered {n}")
    assert len(_chat_rows(db, stray[0])) == 11
    with pytest.raises(UnregisteredChatsFull):
        say(stray[4], "the cap is full again")

    # 0: no limit, either way.
    unbounded = settings.replace(**{"unregistered_chats": 0, "unregistered_chat_messages": 0})
    for n in range(7):
        ingest(db, unbounded, IncomingMessage(chat_jid=stray[4], sender="u", content=f"{n}"), signal=None)
    assert len(_chat_rows(db, stray[4])) == 7


def test_concurrent_first_messages_of_new_chats_never_pass_the_cap(db: Database, settings: Settings) -> None:
    s = settings.replace(**{"unregistered_chats": 3})
    tag = f"{random.getrandbits(32):08x}"
    stored: list[str] = []

    def first_message(i: int) -> None:
        chat = f"rush{i}-{tag}@x"
        try:
            ingest(db, s, IncomingMessage(chat_jid=chat, sender="u", content="hi"), signal=None)
            stored.append(chat)
        except StoreError:  # UnregisteredChatsFull
            pass

    assert run_in_threads(first_message, 10) == []
    assert len(stored) == 3
    assert all(
        _chat_rows(db, f"rush{i}-{tag}@x") == (["hi"] if f"rush{i}-{tag}@x" in stored else []) for i in range(10)
    )


def test_a_batch_with_a_dropped_message_stores_the_others(db: Database, settings: Settings) -> None:
    from orchestrator.core.errors import UnregisteredChatsFull

    ensure_main_group(db)
    s = settings.replace(**{"unregistered_chats": 1})
    tag = f"{random.getrandbits(32):08x}"
    batch = [IncomingMessage(chat_jid=f"b{i}-{tag}@x", sender="u", content=f"m{i}") for i in range(2)]
    batch.append(IncomingMessage(chat_jid="main@local", sender="u", content="registered"))
    first, second, third = ingest_batch(db, s, batch, signal=None)
    assert isinstance(first, IngestResult) and isinstance(third, IngestResult)
    assert isinstance(second, UnregisteredChatsFull)
    assert _chat_rows(db, f"b1-{tag}@x") == []
