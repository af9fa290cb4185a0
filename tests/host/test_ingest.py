"""Ingest: store, decide, mark pending, signal only after commit."""

from __future__ import annotations

import pytest

from orchestrator.db import Database
from orchestrator.errors import InvalidMessage, StoreError
from orchestrator.groups import add_group, ensure_main_group, get_group
from orchestrator.ingest import IncomingMessage, ingest
from orchestrator.router import has_trigger
from orchestrator.settings import Settings
from orchestrator.store import get_messages_after


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
        ingest(db, settings, IncomingMessage(chat_jid="main@local", sender="u", content="x",
                                             timestamp="not a date"), signal=sig)
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
