"""Files through a run, on both databases, with the fake sandbox: a message's files placed
under the workspace's inbox/ and named in the attempt's notice (run/run_files.py); what the
agent hands back with send_file stored and posted with a FILE envelope, or refused by the
hostile-folder rules (sandbox/outbox.py); a replay stores none."""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path

import msgspec
import pytest

from agent_runner.protocol import AssistantEvent, Event, ImageRef, ResultEvent, SendFileEvent, Usage
from fakes.clock import FakeClock
from fakes.sandbox import FakeSandbox, Script
from orchestrator.core.settings import Settings
from orchestrator.model.envelopes import FILE, files_of
from orchestrator.run.assembly import rebuild_input, stored_input
from orchestrator.run.ingest import IncomingMessage, ingest
from orchestrator.run.outbound import ChannelRegistry
from orchestrator.run.pipeline import Pipeline
from orchestrator.run.replay import create_replay, execute_replay
from orchestrator.run.run_diff import run_outputs
from orchestrator.store.db import Database
from orchestrator.store.file_rows import StoredFile
from orchestrator.store.files import FileStore
from orchestrator.store.groups import ensure_main_group
from orchestrator.store.message_log import get_messages_after

JID = "main@local"


def done() -> list[Event]:
    return [AssistantEvent(text="ok"), ResultEvent(usage=Usage())]


def run(
    settings: Settings,
    db: Database,
    events: list[Event],
    *,
    files: list[StoredFile] = (),  # type: ignore[assignment]
    before: Callable[[Path], object] | None = None,
) -> FakeSandbox:
    """One message (with ``files``) of the main group answered by one run playing ``events``;
    ``before`` is given the run's workspace before the agent's first event."""

    def plant(index: int) -> None:
        if before is not None and index == 0:
            workspace = sandbox.started[-1][0].workspace
            workspace.mkdir(parents=True, exist_ok=True)  # a real sandbox makes it: the fake does not
            before(workspace)

    sandbox = FakeSandbox(Script(events, before_event=plant))
    meta = None
    if files:
        meta = {
            "message_type": FILE,
            "payload": {"files": [{"id": f.id, "name": f.name, "mime": f.mime, "size": f.size} for f in files]},
        }
    ingest(db, settings, IncomingMessage(chat_jid=JID, sender="u", content="look", metadata=meta), signal=None)
    Pipeline(settings, db, ChannelRegistry([]), sandbox, clock=FakeClock()).drain_group(JID)
    return sandbox


def replies(db: Database) -> list[str]:
    return [m.content for m in get_messages_after(JID, 0, db=db) if m.sender == "bot"]


@pytest.fixture
def store(db: Database, settings: Settings) -> FileStore:
    ensure_main_group(db)
    return FileStore.from_settings(db, settings)


def test_a_messages_files_are_placed_and_the_notice_says_where(
    settings: Settings, db: Database, store: FileStore
) -> None:
    notes = store.store_bytes(JID, b"first line\n", "../notes.txt")
    pic = store.store_bytes(JID, b"\x89PNG\r\n\x1a\n" + b"\0" * 100, ".hidden.png")
    sandbox = run(settings, db, done(), files=[notes, pic])
    ((spec, sent),) = sandbox.started
    inbox = spec.workspace / "inbox"
    assert (inbox / "notes.txt").read_bytes() == b"first line\n"
    assert (inbox / "hidden.png").stat().st_size == 108
    assert sent.system_notices[-1] == (
        "Files sent with the new messages are in your workspace: "
        "inbox/notes.txt (text/plain, 11 B); inbox/hidden.png (image/png, 108 B)."
    )
    # The model reads the files after the message's words.
    assert sent.messages[-1].content == "look\n📎 notes.txt (text/plain, 11 B), hidden.png (image/png, 108 B)"


def test_the_same_file_again_is_reused_and_another_with_its_name_is_numbered(
    settings: Settings, db: Database, store: FileStore
) -> None:
    first = store.store_bytes(JID, b"v1", "notes.txt")
    run(settings, db, done(), files=[first])
    again = store.store_bytes(JID, b"v1", "notes.txt")  # the same bytes sent again: no copy
    changed = store.store_bytes(JID, b"v2", "notes.txt")
    sandbox = run(settings, db, done(), files=[again, changed])
    spec, sent = sandbox.started[-1]
    assert sorted(os.listdir(spec.workspace / "inbox")) == ["notes (2).txt", "notes.txt"]
    assert (spec.workspace / "inbox" / "notes (2).txt").read_bytes() == b"v2"
    assert "inbox/notes.txt (text/plain, 2 B); inbox/notes (2).txt (text/plain, 2 B)" in sent.system_notices[-1]


def test_an_inbox_the_agent_made_a_symlink_places_nothing_and_the_run_goes_on(
    settings: Settings, db: Database, store: FileStore, tmp_path: Path
) -> None:
    target = tmp_path / "elsewhere"
    target.mkdir()
    first = run(settings, db, done())
    workspace = first.started[0][0].workspace
    workspace.mkdir(parents=True, exist_ok=True)
    (workspace / "inbox").symlink_to(target)
    notes = store.store_bytes(JID, b"x", "notes.txt")
    sandbox = run(settings, db, done(), files=[notes])
    _, sent = sandbox.started[-1]
    assert "could not be placed" in sent.system_notices[-1] and "symlink" in sent.system_notices[-1]
    assert list(target.iterdir()) == []
    assert replies(db)[-1] == "ok"  # answered all the same


def test_send_file_stores_the_workspace_file_and_posts_it(settings: Settings, db: Database, store: FileStore) -> None:
    def write(workspace: Path) -> None:
        (workspace / "out").mkdir()
        (workspace / "out" / "report.txt").write_text("the report\n")

    run(settings, db, [SendFileEvent(path="out/report.txt", caption="done"), *done()], before=write)
    posted = [m for m in get_messages_after(JID, 0, db=db) if files_of(m.metadata)]
    assert len(posted) == 1
    (message,) = posted
    assert (message.message_type, message.sender, message.content) == ("assistant", "bot", "done")
    files = files_of(message.metadata)
    assert files is not None
    (ref,) = files.files
    assert (ref.name, ref.mime, ref.size) == ("report.txt", "text/plain", 11)
    assert store.read_bytes(store.get(ref.id, JID)) == b"the report\n"


@pytest.mark.parametrize(
    ("plant", "path", "why"),
    [
        (lambda w: (w / "passwd").symlink_to("/etc/passwd"), "passwd", "symlink"),
        (lambda w: os.mkfifo(w / "pipe"), "pipe", "not a regular file"),
        (lambda w: (w / "dir").mkdir(), "dir", "directory"),
        (lambda w: None, "../../etc/passwd", "'..' is not allowed"),
        (lambda w: None, "/etc/passwd", "not a relative path"),
        (lambda w: os.truncate(os.open(w / "big", os.O_CREAT | os.O_WRONLY), 2 << 30), "big", "2147483648 bytes"),
    ],
    ids=["symlink", "fifo", "directory", "dotdot", "absolute", "sparse-2GiB"],
)
def test_send_file_refuses_what_is_no_regular_file_within_bounds(
    settings: Settings,
    db: Database,
    store: FileStore,
    plant: Callable[[Path], object],
    path: str,
    why: str,
) -> None:
    run(settings, db, [SendFileEvent(path=path, caption="here"), *done()], before=plant)
    messages = get_messages_after(JID, 0, db=db)
    refusals = [m.content for m in messages if m.message_type == "host" and "send_file refused" in m.content]
    assert len(refusals) == 1 and why in refusals[0]
    assert not any(files_of(m.metadata) for m in messages)
    assert store.list_chat(JID) == []
    assert replies(db)[-1] == "ok"  # the run went on


def test_send_file_past_the_groups_limit_is_refused(settings: Settings, db: Database, store: FileStore) -> None:
    settings = settings.replace(group_files_max_bytes=10)
    run(
        settings,
        db,
        [SendFileEvent(path="a.txt"), *done()],
        before=lambda w: (w / "a.txt").write_bytes(b"x" * 11),
    )
    refusals = [m.content for m in get_messages_after(JID, 0, db=db) if m.message_type == "host"]
    assert any("GROUP_FILES_MAX_BYTES" in r for r in refusals)
    assert store.list_chat(JID) == []


def test_a_replay_keeps_send_file_without_storing_a_file(settings: Settings, db: Database, store: FileStore) -> None:
    settings = settings.replace(max_attempts=1)
    sandbox = run(
        settings,
        db,
        [SendFileEvent(path="r.txt", caption="c"), *done()],
        before=lambda w: (w / "r.txt").write_text("r"),
    )
    original = sandbox.started[0][0].run_id
    before = store.list_chat(JID)
    replay = execute_replay(db, settings, sandbox, create_replay(db, settings, original, "offline").id)
    kept = [o for o in run_outputs(db, replay) if o.content == "c"]
    assert [o.metadata for o in kept] == [{"via": "send_file", "path": "r.txt"}]
    assert store.list_chat(JID) == before


def png(size: int = 100) -> bytes:
    return b"\x89PNG\r\n\x1a\n" + b"\0" * size


def test_a_model_that_sees_images_is_sent_the_runs_own_images_by_path(
    settings: Settings, db: Database, store: FileStore
) -> None:
    pic = store.store_bytes(JID, png(), "cat.png")
    notes = store.store_bytes(JID, b"text", "notes.txt")
    sandbox = run(settings, db, done(), files=[pic, notes])
    _, sent = sandbox.started[-1]
    assert sent.messages[-1].images == [ImageRef(file_id=pic.id, mime="image/png", path="inbox/cat.png")]
    # The next run: the older message names its files in its text, no image is sent again.
    sandbox = run(settings, db, done())
    _, later = sandbox.started[-1]
    older = [m for m in later.messages if m.content.startswith("look\n📎 cat.png")]
    assert len(older) == 1 and older[0].images is msgspec.UNSET


def test_a_model_that_does_not_see_images_gets_their_names_only(
    settings: Settings, db: Database, store: FileStore
) -> None:
    settings = settings.replace(vision_models="gpt-4o*")  # the offline model is not among them
    pic = store.store_bytes(JID, png(), "cat.png")
    sandbox = run(settings, db, done(), files=[pic])
    _, sent = sandbox.started[-1]
    assert sent.messages[-1].images is msgspec.UNSET
    assert sent.messages[-1].content == "look\n📎 cat.png (image/png, 108 B)"
    assert "inbox/cat.png (image/png, 108 B)" in sent.system_notices[-1]


def test_an_image_that_could_not_be_placed_keeps_no_path(
    settings: Settings, db: Database, store: FileStore, tmp_path: Path
) -> None:
    first = run(settings, db, done())
    workspace = first.started[0][0].workspace
    workspace.mkdir(parents=True, exist_ok=True)
    os.mkfifo(workspace / "inbox")
    pic = store.store_bytes(JID, png(), "cat.png")
    _, sent = run(settings, db, done(), files=[pic]).started[-1]
    assert sent.messages[-1].images == [ImageRef(file_id=pic.id, mime="image/png")]
    assert "could not be placed" in sent.system_notices[-1]


def test_a_recorded_input_with_images_rebuilds_the_same(settings: Settings, db: Database, store: FileStore) -> None:
    pic = store.store_bytes(JID, png(), "cat.png")
    sandbox = run(settings, db, done(), files=[pic])
    run_id = sandbox.started[-1][0].run_id
    recorded = stored_input(db, run_id)
    assert recorded is not None
    assert b'"images":[{"file_id"' in recorded  # by id: where it goes is the attempt's
    assert rebuild_input(db, settings, run_id) == recorded
