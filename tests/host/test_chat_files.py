"""Files in the terminal chat (orchestrator/cli/chat.py): `/file PATH [TEXT]` sends a file of
this machine with words; a file the agent sends is saved in the downloads folder, its name
made safe and nothing replaced."""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path

import pytest

from orchestrator.cli.chat import Follower, handle_line
from orchestrator.core.settings import Settings
from orchestrator.model.envelopes import files_of
from orchestrator.model.messages import NewMessage
from orchestrator.store.db import Database
from orchestrator.store.file_refs import file_envelope
from orchestrator.store.files import FileStore
from orchestrator.store.groups import add_group
from orchestrator.store.message_log import get_messages_after, insert_message

JID = "chat@test"


@pytest.fixture
def group(db: Database) -> None:
    add_group(db, chat_jid=JID, name="Chat", folder="chat", requires_trigger=False)


def line(db: Database, settings: Settings, text: str) -> list[str]:
    printed: list[str] = []
    handle_line(text, db=db, settings=settings, jid=JID, sender="ann", out=printed.append, signal=lambda _: None)
    return printed


def test_file_sends_a_local_file_with_its_words(db: Database, settings: Settings, group: None, tmp_path: Path) -> None:
    (tmp_path / "my notes.txt").write_text("the notes\n")
    printed = line(db, settings, f"/file '{tmp_path / 'my notes.txt'}' what is in it?")
    (message,) = get_messages_after(JID, 0, db=db)
    assert message.content == "what is in it?"
    files = files_of(message.metadata)
    assert files is not None
    (ref,) = files.files
    assert (ref.name, ref.mime, ref.size) == ("my notes.txt", "text/plain", 10)
    store = FileStore.from_settings(db, settings)
    assert store.read_bytes(store.get(ref.id, JID)) == b"the notes\n"
    assert printed == [f"   [sent my notes.txt (text/plain, 10 B) as #{message.seq}]"]


@pytest.mark.parametrize(
    ("make", "said"),
    [
        (lambda p: None, "No such file"),
        (lambda p: os.mkfifo(p), "not a regular file"),
        (lambda p: p.mkdir(), "not a regular file"),
    ],
    ids=["missing", "fifo", "directory"],
)
def test_file_refuses_what_it_cannot_send_and_stores_nothing(
    db: Database,
    settings: Settings,
    group: None,
    tmp_path: Path,
    make: Callable[[Path], object],
    said: str,
) -> None:
    make(tmp_path / "x")
    printed = line(db, settings, f"/file {tmp_path / 'x'} hi")
    assert len(printed) == 1 and printed[0].startswith("   [error: ") and said in printed[0]
    assert get_messages_after(JID, 0, db=db) == []
    assert FileStore.from_settings(db, settings).list_chat(JID) == []


def test_file_over_the_limit_is_refused(db: Database, settings: Settings, group: None, tmp_path: Path) -> None:
    (tmp_path / "big.bin").write_bytes(b"x" * 100)
    printed = line(db, settings.replace(file_max_bytes=10), f"/file {tmp_path / 'big.bin'}")
    assert "FILE_MAX_BYTES" in printed[0]
    assert get_messages_after(JID, 0, db=db) == []


def test_the_agents_files_are_saved_in_the_downloads_folder(
    db: Database, settings: Settings, group: None, tmp_path: Path
) -> None:
    store = FileStore.from_settings(db, settings)
    sent = store.store_bytes(JID, b"the report", "../../report.txt")
    with db.write() as session:
        insert_message(
            session,
            db,
            NewMessage(
                id="r1",
                chat_jid=JID,
                sender="bot",
                sender_name="Andy",
                content="done",
                timestamp="2026-11-28T00:00:00+00:00",
                is_from_me=True,
                message_type="assistant",
                metadata=file_envelope([sent]),
            ),
        )
    downloads = tmp_path / "downloads"
    downloads.mkdir()
    (downloads / "report.txt").write_text("mine")  # already there: kept
    printed: list[str] = []
    Follower(db, settings, JID, printed.append, 0, downloads).poll()
    assert (downloads / "report.txt").read_text() == "mine"
    assert (downloads / "report (2).txt").read_bytes() == b"the report"
    assert printed[1] == f"   [saved report.txt (text/plain, 10 B) to {downloads / 'report (2).txt'}]"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["data", "downloads"]  # nothing outside it
