"""Messages that carry files (FILE envelopes): a message may name only its own chat's files,
and what it says of them is the store's word; history, the model's view, export and import
keep them."""

from __future__ import annotations

import base64
import contextlib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from orchestrator.core.errors import FileTooLarge, InvalidMessage, InvalidMessageMetadata
from orchestrator.core.settings import Settings
from orchestrator.model.envelopes import FILE, FilePayload, files_of, with_file_line
from orchestrator.model.render import render_text
from orchestrator.model.views import format_messages_for_sdk
from orchestrator.run.ingest import IncomingMessage, ingest
from orchestrator.store.db import Database
from orchestrator.store.file_refs import file_envelope
from orchestrator.store.file_rows import StoredFile
from orchestrator.store.files import FileStore
from orchestrator.store.groups import add_group
from orchestrator.store.message_log import get_messages_after
from orchestrator.store.transfer import export_chat, export_markdown, import_chat, parse_export
from tests.conftest import fresh_pg_database

CHAT = "files@test"
OTHER = "other@test"


@pytest.fixture
def store(db: Database, settings: Settings) -> FileStore:
    add_group(db, chat_jid=CHAT, name="Files", folder="files", requires_trigger=False)
    add_group(db, chat_jid=OTHER, name="Other", folder="other", requires_trigger=False)
    return FileStore.from_settings(db, settings)


def file_meta(*refs: dict[str, Any]) -> dict[str, Any]:
    return {"message_type": FILE, "version": 1, "payload": {"files": list(refs)}}


def ref(stored: StoredFile, **lies: Any) -> dict[str, Any]:
    return {"id": stored.id, "name": stored.name, "mime": stored.mime, "size": stored.size, **lies}


def send(db: Database, settings: Settings, meta: dict[str, Any], *, chat: str = CHAT, text: str = "see") -> Any:
    return ingest(db, settings, IncomingMessage(chat_jid=chat, sender="ann", content=text, metadata=meta), signal=None)


def test_a_message_names_its_chats_file_and_the_store_has_the_last_word(
    db: Database, settings: Settings, store: FileStore
) -> None:
    notes = store.store_bytes(CHAT, b"line one\n", "notes.txt")
    # The sender claims another name, type and size: the stored row's are kept.
    result = send(db, settings, file_meta(ref(notes, name="evil.exe", mime="text/html", size=1)))
    (stored,) = get_messages_after(CHAT, 0, db=db)
    assert stored.id == result.message.id
    files = files_of(stored.metadata)
    assert files is not None
    assert [(f.id, f.name, f.mime, f.size) for f in files.files] == [(notes.id, "notes.txt", "text/plain", 9)]
    assert stored.content == "see"


@pytest.mark.parametrize("whose", ["another chat's", "never stored"])
def test_a_forged_reference_is_refused_and_nothing_is_stored(
    db: Database, settings: Settings, store: FileStore, whose: str
) -> None:
    theirs = store.store_bytes(OTHER, b"secret", "secret.txt")
    forged = ref(theirs) if whose == "another chat's" else {**ref(theirs), "id": "no-such-file"}
    with pytest.raises(InvalidMessageMetadata) as caught:
        send(db, settings, file_meta(forged))
    assert caught.value.field == "metadata.payload.files[0].id"
    assert CHAT in caught.value.problem
    assert get_messages_after(CHAT, 0, db=db) == []


def test_one_file_named_twice_is_refused(db: Database, settings: Settings, store: FileStore) -> None:
    notes = store.store_bytes(CHAT, b"x", "x.txt")
    with pytest.raises(InvalidMessageMetadata) as caught:
        send(db, settings, file_meta(ref(notes), ref(notes)))
    assert caught.value.field == "metadata.payload.files[1].id"
    assert get_messages_after(CHAT, 0, db=db) == []


def test_the_same_bytes_stored_by_another_chat_are_still_not_this_chats_file(
    db: Database, settings: Settings, store: FileStore
) -> None:
    theirs = store.store_bytes(OTHER, b"same bytes", "a.txt")
    mine = store.store_bytes(CHAT, b"same bytes", "b.txt")
    assert theirs.sha256 == mine.sha256 and theirs.id != mine.id
    with pytest.raises(InvalidMessageMetadata):
        send(db, settings, file_meta(ref(theirs)))
    send(db, settings, file_meta(ref(mine)))
    (stored,) = get_messages_after(CHAT, 0, db=db)
    files = files_of(stored.metadata)
    assert files is not None and files.files[0].id == mine.id


def test_people_and_the_model_read_the_files_after_the_words(
    db: Database, settings: Settings, store: FileStore
) -> None:
    notes = store.store_bytes(CHAT, b"a" * 2048, "notes.txt")
    send(db, settings, file_meta(ref(notes)), text="what is in it?")
    (stored,) = get_messages_after(CHAT, 0, db=db)
    assert render_text(stored, "Andy") == "ann: what is in it?\n📎 notes.txt (text/plain, 2.0 KiB)"
    (seen,) = format_messages_for_sdk([stored])
    assert seen.content == "what is in it?\n📎 notes.txt (text/plain, 2.0 KiB)"
    # A file alone: the line is the whole text.
    assert with_file_line("", stored.metadata) == "📎 notes.txt (text/plain, 2.0 KiB)"


def test_a_file_without_words_is_named_once(db: Database, settings: Settings, store: FileStore) -> None:
    pic = store.store_bytes(CHAT, b"\x89PNG\r\n\x1a\n" + b"\0" * 8, "photo.png")
    send(db, settings, file_meta(ref(pic)), text="")
    (stored,) = get_messages_after(CHAT, 0, db=db)
    assert stored.content == ""
    assert render_text(stored, "Andy") == "ann: 📎 photo.png (image/png, 16 B)"
    (seen,) = format_messages_for_sdk([stored])
    assert seen.content == "📎 photo.png (image/png, 16 B)"


def test_export_and_import_keep_files_by_id_and_refuse_forged_ones(
    db: Database, settings: Settings, store: FileStore
) -> None:
    notes = store.store_bytes(CHAT, b"kept", "kept.txt")
    send(db, settings, file_meta(ref(notes)))
    doc = export_chat(db, CHAT)
    assert f"(file `{notes.id}`)" in export_markdown(db, CHAT, "Andy")
    # Imported again (nothing new), its files are still named by id.
    assert import_chat(db, doc).skipped == 1
    # An export for the other chat naming this chat's file: refused, nothing stored.
    forged = doc.model_copy(
        update={
            "chat_jid": OTHER,
            "group": None,
            "messages": [m.model_copy(update={"chat_jid": OTHER, "id": "forged-1"}) for m in doc.messages],
        }
    )
    with pytest.raises(InvalidMessageMetadata) as caught:
        import_chat(db, forged)
    assert caught.value.field == "messages[forged-1].metadata.payload.files[0].id"
    assert get_messages_after(OTHER, 0, db=db) == []


def test_a_file_envelope_is_built_from_stored_rows(db: Database, settings: Settings, store: FileStore) -> None:
    a = store.store_bytes(CHAT, b"\x89PNG\r\n\x1a\n" + b"\0" * 8, "../../pic.png")
    meta = file_envelope([a], extras={"via": "send_file"})
    assert meta["via"] == "send_file"
    files = files_of(meta)
    assert isinstance(files, FilePayload)
    assert (files.files[0].name, files.files[0].mime) == ("pic.png", "image/png")


@contextlib.contextmanager
def another_installation(settings: Settings, db_backend: str, folder: Path) -> Iterator[tuple[Settings, Database]]:
    """A second installation: its own data dir and its own database of the same backend."""
    with contextlib.ExitStack() as stack:
        url = "" if db_backend == "sqlite" else stack.enter_context(fresh_pg_database(migrated=True))
        there = settings.replace(data_dir=folder, database_url=url)
        there.ensure_dirs()
        database = Database(there.effective_database_url, lock_dir=there.data_dir)
        database.migrate()
        stack.callback(database.dispose)
        yield there, database


def test_an_export_with_files_carries_them_into_another_installation(
    db: Database, settings: Settings, store: FileStore, tmp_path: Path, db_backend: str
) -> None:
    notes = store.store_bytes(CHAT, b"carried bytes", "notes.txt")
    send(db, settings, file_meta(ref(notes)))
    doc = export_chat(db, CHAT, files=store)
    assert [(f.id, f.name) for f in doc.files] == [(notes.id, "notes.txt")]
    assert base64.b64decode(doc.files[0].data) == b"carried bytes"

    # Another installation (a fresh data dir and database) takes it in.
    with another_installation(settings, db_backend, tmp_path / "elsewhere") as (other_settings, other):
        there = FileStore.from_settings(other, other_settings)
        result = import_chat(other, parse_export(doc.model_dump_json()), files=there)
        assert result.imported == 1
        (message,) = get_messages_after(CHAT, 0, db=other)
        files = files_of(message.metadata)
        assert files is not None
        (renamed,) = files.files
        assert renamed.id != notes.id  # stored again, under its own id
        assert there.read_bytes(there.get(renamed.id, CHAT)) == b"carried bytes"


def test_an_import_carrying_files_over_the_limit_keeps_nothing(
    db: Database, settings: Settings, store: FileStore
) -> None:
    notes = store.store_bytes(CHAT, b"x" * 64, "notes.txt")
    send(db, settings, file_meta(ref(notes)))
    doc = export_chat(db, CHAT, files=store)
    forged = doc.model_copy(
        update={
            "chat_jid": OTHER,
            "group": None,
            "messages": [m.model_copy(update={"chat_jid": OTHER}) for m in doc.messages],
        }
    )
    small = FileStore.from_settings(db, settings.replace(file_max_bytes=32))
    with pytest.raises(FileTooLarge):
        import_chat(db, forged, files=small)
    assert small.list_chat(OTHER) == [] and get_messages_after(OTHER, 0, db=db) == []
    # A carried file that is fine, a message that fails: the file is taken back too.
    bad = forged.model_copy(
        update={
            "messages": [
                *forged.messages,
                forged.messages[0].model_copy(update={"id": "x", "metadata": {"message_type": 7}}),
            ]
        }
    )
    with pytest.raises(InvalidMessageMetadata):
        import_chat(db, bad, files=store)
    assert store.list_chat(OTHER) == [] and get_messages_after(OTHER, 0, db=db) == []


def test_an_export_that_carries_files_needs_a_store_to_import(
    db: Database, settings: Settings, store: FileStore
) -> None:
    send(db, settings, file_meta(ref(store.store_bytes(CHAT, b"x", "x.txt"))))
    doc = export_chat(db, CHAT, files=store)
    with pytest.raises(InvalidMessage, match="carries files"):
        import_chat(db, doc)
