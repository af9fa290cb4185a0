"""Keeping files (orchestrator/store/files.py): a file no live message names is freed after
its grace, by the sweeper or `orchestrator files prune`; its bytes go once no row names
them; `files rm` frees one now; the rows that say which message names which file are
written with every message, and the migration writes them for messages stored before."""

from __future__ import annotations

import json
import os
import time
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from orchestrator.cli.main import app
from orchestrator.core.errors import NotFound
from orchestrator.core.settings import Settings
from orchestrator.model.envelopes import FILE
from orchestrator.run.ingest import IncomingMessage, ingest
from orchestrator.run.sweeper import sweep
from orchestrator.store.db import Database, driver_execute
from orchestrator.store.file_rows import StoredFile, new_file_id
from orchestrator.store.files import FileStore
from orchestrator.store.groups import add_group
from orchestrator.store.history import truncate_after
from orchestrator.store.message_log import get_messages_after
from tests.conftest import alembic

CHAT = "keep@test"
OTHER = "other@test"


@pytest.fixture
def store(db: Database, settings: Settings) -> FileStore:
    add_group(db, chat_jid=CHAT, name="Keep", folder="keep", requires_trigger=False)
    add_group(db, chat_jid=OTHER, name="Other", folder="other", requires_trigger=False)
    return FileStore.from_settings(db, settings)


def name(db: Database, settings: Settings, *files: StoredFile, chat: str = CHAT, text: str = "see") -> str:
    """A person's message naming ``files``; its id."""
    refs = [{"id": f.id, "name": f.name, "mime": f.mime, "size": f.size} for f in files]
    meta: dict[str, Any] = {"message_type": FILE, "payload": {"files": refs}}
    return ingest(
        db, settings, IncomingMessage(chat_jid=chat, sender="ann", content=text, metadata=meta), signal=None
    ).message.id


def ids(files: list[StoredFile]) -> set[str]:
    return {f.id for f in files}


def test_a_file_no_message_names_is_freed_after_its_grace_only(
    db: Database, settings: Settings, store: FileStore
) -> None:
    named = store.store_bytes(CHAT, b"named", "named.txt")
    loose = store.store_bytes(CHAT, b"loose", "loose.txt")
    name(db, settings, named)
    assert store.prune(3600) == []  # within its grace: its message may still come
    assert ids(store.prune(0)) == {loose.id}
    assert ids(store.list_chat(CHAT)) == {named.id}
    assert not store.path_of(loose.sha256).exists()
    assert store.path_of(named.sha256).exists()


def test_a_truncated_messages_files_are_freed(db: Database, settings: Settings, store: FileStore) -> None:
    first = name(db, settings, store.store_bytes(CHAT, b"one", "one.txt"), text="first")
    later = store.store_bytes(CHAT, b"two", "two.txt")
    name(db, settings, later, text="later")
    assert store.prune(0) == []
    truncate_after(db, settings, CHAT, first)  # "later" is superseded: shown nowhere
    assert ids(store.prune(0)) == {later.id}


def test_bytes_another_chat_still_names_stay(db: Database, settings: Settings, store: FileStore) -> None:
    mine = store.store_bytes(CHAT, b"shared bytes", "a.txt")
    theirs = store.store_bytes(OTHER, b"shared bytes", "b.txt")
    name(db, settings, theirs, chat=OTHER)
    assert ids(store.prune(0)) == {mine.id}
    assert store.path_of(theirs.sha256).exists()
    assert store.read_bytes(store.get(theirs.id, OTHER)) == b"shared bytes"
    # The bytes count against the chat that still holds them.
    assert store.group_bytes(OTHER) == len(b"shared bytes") and store.group_bytes(CHAT) == 0


def test_a_file_the_agent_sent_is_named_by_its_reply(db: Database, settings: Settings, store: FileStore) -> None:
    from agent_runner.protocol import AssistantEvent, ResultEvent, SendFileEvent, Usage
    from fakes.clock import FakeClock
    from fakes.sandbox import FakeSandbox, Script
    from orchestrator.run.outbound import ChannelRegistry
    from orchestrator.run.pipeline import Pipeline

    def write(index: int) -> None:
        if index == 0:
            workspace = sandbox.started[-1][0].workspace
            workspace.mkdir(parents=True, exist_ok=True)
            (workspace / "out.txt").write_text("out")

    sandbox = FakeSandbox(
        Script(
            [SendFileEvent(path="out.txt"), AssistantEvent(text="ok"), ResultEvent(usage=Usage())], before_event=write
        )
    )
    ingest(db, settings, IncomingMessage(chat_jid=CHAT, sender="ann", content="go"), signal=None)
    Pipeline(settings, db, ChannelRegistry([]), sandbox, clock=FakeClock()).drain_group(CHAT)
    (sent,) = store.list_chat(CHAT)
    assert store.prune(0) == []  # its reply names it
    assert store.get(sent.id, CHAT) == sent


def test_files_rm_frees_a_named_file_now(db: Database, settings: Settings, store: FileStore) -> None:
    notes = store.store_bytes(CHAT, b"notes", "notes.txt")
    name(db, settings, notes)
    env = {
        "ORCHESTRATOR_DATA_DIR": str(settings.data_dir),
        "ORCHESTRATOR_DATABASE_URL": settings.effective_database_url,
    }
    listed = CliRunner().invoke(app, ["files", "list", CHAT, "--json"], env=env)
    assert listed.exit_code == 0, listed.output
    assert [f["id"] for f in json.loads(listed.stdout)] == [notes.id]
    gone = CliRunner().invoke(app, ["files", "rm", CHAT, notes.id], env=env)
    assert gone.exit_code == 0, gone.output
    with pytest.raises(NotFound):
        store.get(notes.id)
    missing = CliRunner().invoke(app, ["files", "rm", OTHER, notes.id], env=env)
    assert missing.exit_code != 0 and "no file" in missing.output
    # The message still names it, and reads as before.
    (message,) = get_messages_after(CHAT, 0, db=db)
    assert message.metadata is not None and message.metadata["payload"]["files"][0]["name"] == "notes.txt"


def test_the_sweeper_and_files_prune_free_what_no_message_names(
    db: Database, settings: Settings, store: FileStore
) -> None:
    loose = store.store_bytes(CHAT, b"loose", "loose.txt")
    report = sweep(db, signal=None, files=store, file_grace_s=3600)
    assert report.freed_files == 0
    report = sweep(db, signal=None, files=store, file_grace_s=0)
    assert report.freed_files == 1 and store.list_chat(CHAT) == []
    again = store.store_bytes(CHAT, b"again", "again.txt")
    env = {
        "ORCHESTRATOR_DATA_DIR": str(settings.data_dir),
        "ORCHESTRATOR_DATABASE_URL": settings.effective_database_url,
    }
    pruned = CliRunner().invoke(app, ["files", "prune", "--grace-s", "0"], env=env)
    assert pruned.exit_code == 0, pruned.output
    assert again.id in pruned.stdout and loose.id not in pruned.stdout
    assert store.list_chat(CHAT) == []


def test_an_upload_cut_off_mid_way_is_removed_after_the_grace(store: FileStore) -> None:
    tmp = store.root / "tmp"
    tmp.mkdir(parents=True, exist_ok=True)
    old, fresh = tmp / ".upload-old", tmp / ".upload-fresh"
    old.write_bytes(b"x")
    fresh.write_bytes(b"y")
    an_hour_ago = time.time() - 3600
    os.utime(old, (an_hour_ago, an_hour_ago))
    store.prune(600)
    assert not old.exists() and fresh.exists()


def test_the_migration_names_the_files_of_messages_stored_before_it(
    db: Database, settings: Settings, store: FileStore
) -> None:
    notes = store.store_bytes(CHAT, b"notes", "notes.txt")
    message_id = name(db, settings, notes)
    alembic(db, "downgrade", "0019")
    alembic(db, "upgrade", "head")
    with db.engine.connect() as conn:
        rows = driver_execute(conn, "SELECT chat_jid, message_id, file_id FROM message_files").fetchall()
    assert [tuple(r) for r in rows] == [(CHAT, message_id, notes.id)]
    assert store.prune(0) == []


def test_the_sweep_of_an_unregistered_chats_window_frees_its_files(
    db: Database, settings: Settings, tmp_path: Path
) -> None:
    settings = settings.replace(unregistered_chat_messages=1, api_require_registered_chat=False)
    store = FileStore.from_settings(db, settings)
    stranger = "stranger@test"
    f = store.store_bytes(stranger, b"theirs", "theirs.txt")
    name(db, settings, f, chat=stranger)
    ingest(db, settings, IncomingMessage(chat_jid=stranger, sender="s", content="next"), signal=None)
    assert [m.content for m in get_messages_after(stranger, 0, db=db)] == ["next"]  # the window kept one
    assert ids(store.prune(0)) == {f.id}


def test_a_file_id_never_reads_as_an_option_on_a_command_line() -> None:
    # One token in 64 begins with "-" (base64url); 3,000 ids all but certainly hold one if
    # the rule were gone, which `files rm CHAT ID` would take for an option (CI did).
    ids = [new_file_id() for _ in range(3000)]
    assert not [i for i in ids if i.startswith("-")]
    assert {len(i) for i in ids} == {24} and len(set(ids)) == len(ids)
