"""Pushed streams, on both databases: a change of a chat wakes its open readers.

A real uvicorn server on loopback serves the chat's event stream; the changes come from
another process or another connection, as a worker's would; the wake-ups are the real
ones (PostgreSQL's LISTEN/NOTIFY, SQLite's wake-up files under inotify), heard by the
process's listener (orchestrator/store/chat_listener.py).  The readers' safety poll is set
to 30 s, so a change that arrives in a few seconds came by the push; a change whose
wake-up was lost arrives at the (here short) safety poll.  Drafts arrive as text appended
at an offset, and whole again when the draft starts over.
"""

from __future__ import annotations

import random
import shutil
import subprocess
import sys
import textwrap
import time
from collections.abc import Iterator
from typing import Any

import pytest
from sqlalchemy import text

from orchestrator.cli.chat import Follower
from orchestrator.core.settings import Settings
from orchestrator.http.api import create_app
from orchestrator.model.messages import NewMessage
from orchestrator.root import Orchestrator
from orchestrator.store.chat_wakeups import wake_folder
from orchestrator.store.db import Database
from orchestrator.store.draft_feed import DraftFeed
from orchestrator.store.drafts import drop_draft, save_draft
from orchestrator.store.groups import add_group
from orchestrator.store.message_log import insert_message, now_iso, store_message_direct
from orchestrator.store.runs import create_run, set_container
from tests.conftest import wait_until
from tests.host.test_api_stream import EventReader
from tests.live_server import serve

JID = "push@local"
SAFETY_S = 30.0  # no look without a wake-up for this long: what arrives sooner was pushed
SOON_S = 8.0  # "within a few seconds" on a loaded 2-core machine


@pytest.fixture
def writer(db: Database, settings: Settings) -> Iterator[Database]:
    """Another connection to the test's database, as another process's would be."""
    add_group(db, chat_jid=JID, name="Push", folder="push", requires_trigger=False)
    other = Database(settings.effective_database_url, lock_dir=settings.data_dir)
    yield other
    other.dispose()


@pytest.fixture
def api(settings: Settings, writer: Database) -> Iterator[str]:
    with serve(create_app(Orchestrator(settings.replace(stream_safety_poll_s=SAFETY_S)))) as url:
        yield url


def _msg(db: Database, mid: str, content: str = "hi") -> int:
    return store_message_direct(
        db=db, id=mid, chat_jid=JID, sender="u1", sender_name="Ann", content=content, timestamp=now_iso()
    ).seq


def _open(api: str, query: str = "") -> EventReader:
    reader = EventReader(f"{api}/api/chats/{JID}/stream{query}")
    assert reader.response.status_code == 200
    return reader


def _ready(reader: EventReader, writer: Database, mid: str = "m0") -> None:
    """The stream has looked (it shows a first message) and its listener is ready."""
    _msg(writer, mid, "first")
    assert reader.next().json["id"] == mid
    time.sleep(0.5)  # the listener's start-up wake-up is past: only a push looks again now


def test_a_message_stored_by_another_process_reaches_an_open_stream_by_push(
    settings: Settings, writer: Database, api: str
) -> None:
    events = _open(api)
    try:
        _ready(events, writer)
        script = textwrap.dedent(
            f"""
            from orchestrator.store.db import Database
            from orchestrator.store.message_log import now_iso, store_message_direct
            db = Database({settings.effective_database_url!r})
            store_message_direct(db=db, id="from-another-process", chat_jid={JID!r}, sender="u2",
                                 sender_name="Bob", content="pushed", timestamp=now_iso())
            """
        )
        started = time.monotonic()
        done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=60)
        assert done.returncode == 0, done.stderr
        ev = events.next(timeout=SOON_S)
        assert (ev.event, ev.json["id"], ev.json["content"]) == ("message", "from-another-process", "pushed")
        assert time.monotonic() - started < SAFETY_S / 2

        # Another connection of this process, and a run's state changes: pushed too.
        _msg(writer, "m2", "again")
        assert events.next(timeout=SOON_S).json["id"] == "m2"
        run = create_run(writer, chat_jid=JID, cursor_from=0, cursor_to=1, celery_task_id=None)
        ev = events.next(timeout=SOON_S)
        assert (ev.event, ev.json["id"], ev.json["state"]) == ("run", run.id, "queued")
        set_container(writer, run.id, "c0ffee")
        assert events.next(timeout=SOON_S).json["state"] == "running"
    finally:
        events.close()


def test_the_wakeup_comes_at_commit_and_never_for_a_rollback(writer: Database, api: str) -> None:
    events = _open(api)
    try:
        _ready(events, writer)
        # A wake-up sent before the commit would make the stream look, find nothing, and
        # wait for the safety poll: the message must still come at once after the commit.
        with writer.transaction() as conn:
            insert_message(conn, writer, _new("in-a-transaction"))
            time.sleep(1.0)
        assert events.next(timeout=SOON_S).json["id"] == "in-a-transaction"

        with pytest.raises(RuntimeError), writer.transaction() as conn:
            insert_message(conn, writer, _new("rolled-back"))
            raise RuntimeError("the caller gives up")
        assert events.quiet(1.0) == []
        _msg(writer, "after-the-rollback")
        assert events.next(timeout=SOON_S).json["id"] == "after-the-rollback"
    finally:
        events.close()


def _new(mid: str) -> NewMessage:
    return NewMessage(id=mid, chat_jid=JID, sender="u1", sender_name="Ann", content="x", timestamp=now_iso())


def _insert_without_wakeup(db: Database, mid: str) -> None:
    """A message stored by a writer that wakes nobody (its wake-up lost): plain SQL."""
    with db.engine.begin() as conn:
        conn.execute(
            text(
                "INSERT INTO messages (seq, id, chat_jid, sender, sender_name, content, timestamp, is_from_me, "
                "message_type) VALUES ((SELECT COALESCE(MAX(seq), 0) + 1 FROM messages), :id, :chat_jid, 'u1', "
                "'Ann', 'unannounced', :ts, :false, 'user')"
            ),
            {"id": mid, "chat_jid": JID, "ts": now_iso(), "false": False},
        )


def test_a_lost_wakeup_is_caught_by_the_safety_poll(settings: Settings, writer: Database) -> None:
    safety_s = 1.5
    with serve(create_app(Orchestrator(settings.replace(stream_safety_poll_s=safety_s)))) as api:
        events = _open(api)
        try:
            _ready(events, writer)
            _insert_without_wakeup(writer, "lost")
            # Found by the look the safety poll makes: no wake-up was sent.
            assert events.next(timeout=safety_s + SOON_S).json["id"] == "lost"
        finally:
            events.close()


def test_the_listener_comes_back_after_losing_its_source(
    db: Database, settings: Settings, writer: Database, api: str
) -> None:
    """PostgreSQL: the LISTEN connection's backend ended (a server restart); SQLite: the
    wake-up folder removed.  The listener comes back, looks once for what it missed, and
    later changes are pushed again."""
    events = _open(api)
    try:
        _ready(events, writer)
        if db.is_sqlite:
            folder = wake_folder(db)
            assert folder is not None and folder.is_dir()
            shutil.rmtree(folder)
        else:
            with writer.engine.connect() as conn:
                ended = conn.execute(
                    text(
                        "SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
                        "WHERE application_name = 'orchestrator-chat-listener' AND datname = current_database()"
                    )
                ).all()
            assert ended and all(row[0] for row in ended)
        # Stored while the listener is down or coming back: its wake-up may be lost, and the
        # look the listener asks for when it is back finds it.
        _msg(writer, "while-down")
        assert events.next(timeout=SOON_S).json["id"] == "while-down"
        if db.is_sqlite:
            wait_until(lambda: folder is not None and folder.is_dir(), SOON_S, "the wake-up folder made again")
        time.sleep(1.0)
        _msg(writer, "pushed-again")
        assert events.next(timeout=SOON_S).json["id"] == "pushed-again"
    finally:
        events.close()


def _apply(shown: str, piece: dict[str, Any]) -> str:
    return shown[: piece["offset"]] + piece["text"]


def test_drafts_arrive_as_appended_text_at_their_offsets(writer: Database, api: str) -> None:
    appended = _open(api, "?drafts=append")
    whole = _open(api)  # a client that reads only `text`
    try:
        run = create_run(writer, chat_jid=JID, cursor_from=0, cursor_to=0, celery_task_id=None)
        set_container(writer, run.id, "c0ffee")
        for reader in (appended, whole):
            reader.until(lambda e: e.event == "run" and e.json["state"] == "running", timeout=SOON_S)

        def draft(reader: EventReader) -> dict[str, Any]:
            ev, _ = reader.until(lambda e: e.event == "draft", timeout=SOON_S)
            piece: dict[str, Any] = ev.json
            assert set(piece) == {"run_id", "offset", "text"} and piece["run_id"] == run.id
            return piece

        writes = [
            ("Hello", 0, "Hello"),
            ("Hello, wor", 5, ", wor"),
            ("Hello, world 🌍", 10, "ld 🌍"),  # offsets count characters, not bytes or UTF-16 units
            ("Hello, world 🌍!", 14, "!"),
            ("Help me", 0, "Help me"),  # replaced (a new attempt's text): the whole of it, from 0
            ("Help me now", 7, " now"),
        ]
        shown = ""
        for version, (new_text, offset, piece_text) in enumerate(writes, 1):
            save_draft(writer, run.id, JID, new_text, version)
            piece = draft(appended)
            assert (piece["offset"], piece["text"]) == (offset, piece_text)
            shown = _apply(shown, piece)
            assert shown == new_text
            assert draft(whole) == {"run_id": run.id, "offset": 0, "text": new_text}

        drop_draft(writer, run.id)  # the reply stored
        assert draft(appended) == {"run_id": run.id, "offset": 0, "text": ""}
        assert draft(whole) == {"run_id": run.id, "offset": 0, "text": ""}
        save_draft(writer, run.id, JID, "Next reply", len(writes) + 1)
        assert draft(appended) == {"run_id": run.id, "offset": 0, "text": "Next reply"}
    finally:
        appended.close()
        whole.close()


def test_a_draft_feed_rebuilds_every_version_of_a_draft(db: Database, writer: Database) -> None:
    """Grown, replaced, rewritten as it was, dropped and begun again, in any order: what
    the reader rebuilds from the pieces is the stored draft after every look."""
    run = create_run(writer, chat_jid=JID, cursor_from=0, cursor_to=0, celery_task_id=None)
    set_container(writer, run.id, "c0ffee")
    feed = DraftFeed(db, JID, "append")
    rng = random.Random(37)
    current: str | None = None
    shown: str | None = None
    for version in range(1, 200):
        roll = rng.random()
        if current is not None and roll < 0.6:
            current += "".join(rng.choice("ab é🌍\n") for _ in range(rng.randint(1, 5)))
        elif current is not None and roll < 0.7:
            current = current[: rng.randint(0, len(current))] + "x"  # replaced, sharing a start
        elif roll < 0.8 and current is not None:
            pass  # written again as it was
        elif roll < 0.9:
            drop_draft(writer, run.id)
            current = None
        else:
            current = rng.choice(["a", "b", "ab"])
        if current is not None:
            save_draft(writer, run.id, JID, current, version)
        if rng.random() < 0.7:  # a reader does not see every version
            for piece in feed.changes():
                shown = None if (piece.offset, piece.text) == (0, "") else _apply(shown or "", piece.model_dump())
            assert shown == current


def test_the_terminal_chat_follower_wakes_on_the_push(db: Database, settings: Settings, writer: Database) -> None:
    printed: list[str] = []
    _msg(writer, "m0", "before")
    follower = Follower(db, settings.replace(stream_safety_poll_s=SAFETY_S), JID, printed.append, after=0)
    follower.start()
    try:
        wait_until(lambda: any("before" in line for line in printed), SOON_S, "the first look")
        time.sleep(0.5)  # the listener's start-up wake-up is past
        started = time.monotonic()
        _msg(writer, "m1", "pushed to the terminal")
        wait_until(lambda: any("pushed to the terminal" in line for line in printed), SOON_S, "the pushed message")
        run = create_run(writer, chat_jid=JID, cursor_from=0, cursor_to=1, celery_task_id=None)
        set_container(writer, run.id, "c0ffee")
        save_draft(writer, run.id, JID, "Thinking", 1)
        wait_until(lambda: "   ✎ Thinking" in printed, SOON_S, "the draft")
        save_draft(writer, run.id, JID, "Thinking about it", 2)
        wait_until(lambda: "   ✎ about it" in printed, SOON_S, "what the draft grew by")
        assert time.monotonic() - started < SAFETY_S / 2
    finally:
        follower.stop()


def test_the_web_page_grows_a_draft_from_appended_text(writer: Database, api: str, page: Any) -> None:
    page.goto(f"{api}/#chat_jid={JID}")
    page.wait_for_selector("#conn[data-state='live']")
    run = create_run(writer, chat_jid=JID, cursor_from=0, cursor_to=0, celery_task_id=None)
    set_container(writer, run.id, "c0ffee")
    page.wait_for_selector("#run-status[data-state='running']")
    draft = f"article.msg-draft[data-run='{run.id}'] .text"

    def shows(expected: str, pieces: int) -> None:
        page.wait_for_function(
            "([sel, text, n]) => { const t = document.querySelector(sel);"
            " return t !== null && t.textContent === text && t.childNodes.length === n; }",
            arg=[draft, expected, pieces],
            timeout=SOON_S * 1000,
        )

    for version, (new_text, pieces) in enumerate(
        [("Hello", 1), ("Hello, wor", 2), ("Hello, world 🌍", 3), ("Hello, world 🌍!", 4), ("Help me", 1)], 1
    ):
        save_draft(writer, run.id, JID, new_text, version)
        # Each piece appended as a text node of its own; a replaced draft written whole.
        shows(new_text, pieces)
    drop_draft(writer, run.id)
    page.wait_for_selector(f"article.msg-draft[data-run='{run.id}']", state="detached", timeout=SOON_S * 1000)
