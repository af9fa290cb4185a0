"""A run's files placed under the workspace's inbox/ (orchestrator/sandbox/inbox.py): never
through a link the agent planted, never over anything there, never reading a content file
that is not what was stored."""

from __future__ import annotations

import os
import stat
import time
from pathlib import Path

import pytest

from orchestrator.core.errors import HostileEntry, StoreError
from orchestrator.core.settings import Settings
from orchestrator.sandbox import inbox as inbox_module
from orchestrator.sandbox.inbox import PlacedFile, place_files, workspace_owner
from orchestrator.store.db import Database
from orchestrator.store.file_rows import StoredFile
from orchestrator.store.files import FileStore

CHAT = "main@local"
ROOT_ONLY = pytest.mark.skipif(os.geteuid() != 0, reason="handing files to another user needs root")


@pytest.fixture
def store(db: Database, settings: Settings) -> FileStore:
    return FileStore.from_settings(db, settings)


@pytest.fixture
def workspace(tmp_path: Path) -> Path:
    folder = tmp_path / "workspace"
    folder.mkdir()
    return folder


def put(store: FileStore, data: bytes, name: str) -> StoredFile:
    return store.store_bytes(CHAT, data, name)


def test_files_are_placed_under_inbox_with_safe_names(store: FileStore, workspace: Path) -> None:
    a = put(store, b"alpha\n", "../../notes.txt")
    b = put(store, b"\x89PNG\r\n\x1a\n" + bytes(50), ".hidden.png")
    placed = place_files(workspace, [a, b], store, owner=(os.getuid(), os.getgid()))
    assert placed == [
        PlacedFile(a.id, "inbox/notes.txt", "notes.txt", 6, "text/plain"),
        PlacedFile(b.id, "inbox/hidden.png", "hidden.png", 58, "image/png"),
    ]
    assert (workspace / "inbox" / "notes.txt").read_bytes() == b"alpha\n"
    assert (workspace / "inbox" / "hidden.png").read_bytes() == store.read_bytes(b)
    assert sorted(os.listdir(workspace)) == ["inbox"]
    assert place_files(workspace, [], store) == []


def test_the_same_name_twice_gets_a_number_and_the_same_bytes_are_reused(store: FileStore, workspace: Path) -> None:
    a = put(store, b"one", "report.txt")
    b = put(store, b"two", "report.txt")
    placed = place_files(workspace, [a, b, a], store)
    assert [p.name for p in placed] == ["report.txt", "report (2).txt", "report.txt"]
    assert (workspace / "inbox" / "report (2).txt").read_bytes() == b"two"
    # Placed again (a retried attempt): no copy is added.
    assert [p.name for p in place_files(workspace, [b], store)] == ["report (2).txt"]
    assert sorted(os.listdir(workspace / "inbox")) == ["report (2).txt", "report.txt"]


def test_a_planted_symlink_or_fifo_is_never_taken_for_the_same_bytes(
    store: FileStore, workspace: Path, tmp_path: Path
) -> None:
    twin = tmp_path / "twin.txt"
    twin.write_bytes(b"same")
    (workspace / "inbox").mkdir()
    (workspace / "inbox" / "same.txt").symlink_to(twin)  # a link to the very bytes
    os.mkfifo(workspace / "inbox" / "same (2).txt")  # would hang a blocking reader
    placed = place_files(workspace, [put(store, b"same", "same.txt")], store)
    assert placed[0].name == "same (3).txt"
    assert (workspace / "inbox" / "same (3).txt").read_bytes() == b"same"


def test_an_existing_file_is_kept_and_the_new_one_numbered(store: FileStore, workspace: Path) -> None:
    (workspace / "inbox").mkdir()
    (workspace / "inbox" / "data.csv").write_text("the agent's own")
    (workspace / "inbox" / "data (2).csv").write_text("and another")
    placed = place_files(workspace, [put(store, b"a,b\n1,2\n", "data.csv")], store)
    assert placed[0].path == "inbox/data (3).csv"
    assert (workspace / "inbox" / "data.csv").read_text() == "the agent's own"
    assert (workspace / "inbox" / "data (2).csv").read_text() == "and another"
    assert (workspace / "inbox" / "data (3).csv").read_bytes() == b"a,b\n1,2\n"


def test_a_symlink_planted_at_inbox_is_refused_and_nothing_placed(
    store: FileStore, workspace: Path, tmp_path: Path
) -> None:
    outside = tmp_path / "outside"
    outside.mkdir()
    (workspace / "inbox").symlink_to(outside)
    with pytest.raises(HostileEntry) as exc:
        place_files(workspace, [put(store, b"secret plans", "plans.txt")], store)
    assert exc.value.path == "inbox" and "symlink" in exc.value.reason
    assert os.listdir(outside) == []
    assert (workspace / "inbox").is_symlink()


@pytest.mark.parametrize("kind", ["file", "fifo", "dangling symlink"])
def test_an_inbox_that_is_no_folder_is_refused(store: FileStore, workspace: Path, kind: str) -> None:
    target = workspace / "inbox"
    if kind == "file":
        target.write_text("not a folder")
    elif kind == "fifo":
        os.mkfifo(target)
    else:
        target.symlink_to(workspace / "nowhere")
    started = time.monotonic()
    with pytest.raises(HostileEntry) as exc:
        place_files(workspace, [put(store, b"x", "x.txt")], store)
    assert time.monotonic() - started < 5  # a FIFO never blocks the worker
    assert exc.value.path == "inbox" and "no file placed" in exc.value.reason
    assert not (workspace / "nowhere").exists()
    assert sorted(os.listdir(workspace)) == ["inbox"]


def test_a_symlink_at_the_target_name_is_never_followed(store: FileStore, workspace: Path, tmp_path: Path) -> None:
    victim = tmp_path / "victim.txt"
    victim.write_text("host file")
    (workspace / "inbox").mkdir()
    (workspace / "inbox" / "notes.txt").symlink_to(victim)
    (workspace / "inbox" / "gone.txt").symlink_to(tmp_path / "does-not-exist.txt")
    placed = place_files(workspace, [put(store, b"new", "notes.txt"), put(store, b"new2", "gone.txt")], store)
    assert [p.name for p in placed] == ["notes (2).txt", "gone (2).txt"]
    assert victim.read_text() == "host file"
    assert not (tmp_path / "does-not-exist.txt").exists()  # a dangling link is not created through
    assert (workspace / "inbox" / "notes.txt").is_symlink()
    assert (workspace / "inbox" / "notes (2).txt").read_bytes() == b"new"


def test_a_fifo_at_the_target_name_is_kept_and_never_opened(store: FileStore, workspace: Path) -> None:
    (workspace / "inbox").mkdir()
    os.mkfifo(workspace / "inbox" / "pipe.txt")
    started = time.monotonic()
    placed = place_files(workspace, [put(store, b"data", "pipe.txt")], store)
    assert time.monotonic() - started < 5
    assert placed[0].name == "pipe (2).txt"
    assert stat.S_ISFIFO(os.lstat(workspace / "inbox" / "pipe.txt").st_mode)


def test_a_workspace_that_is_a_symlink_is_refused(store: FileStore, tmp_path: Path, workspace: Path) -> None:
    link = tmp_path / "linked-workspace"
    link.symlink_to(workspace)
    with pytest.raises(HostileEntry):
        place_files(link, [put(store, b"x", "x.txt")], store)
    assert os.listdir(workspace) == []


def test_a_huge_sparse_content_file_is_refused_by_its_size_unread(
    store: FileStore, workspace: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    small = put(store, b"fine", "fine.txt")
    stored = put(store, b"a small file", "big.bin")
    path = store.path_of(stored.sha256)
    with open(path, "r+b") as fh:
        fh.truncate(2 << 30)  # 2 GiB, sparse: what a row of 12 bytes now points at
    read = {"bytes": 0}
    real_read, real_pread = os.read, os.pread

    def counting_read(fd: int, n: int) -> bytes:
        data = real_read(fd, n)
        read["bytes"] += len(data)
        return data

    def counting_pread(fd: int, n: int, offset: int) -> bytes:
        data = real_pread(fd, n, offset)
        read["bytes"] += len(data)
        return data

    monkeypatch.setattr(os, "read", counting_read)
    monkeypatch.setattr(os, "pread", counting_pread)
    with pytest.raises(StoreError, match="not the 12 stored"):
        place_files(workspace, [small, stored], store)
    assert read["bytes"] == 0  # refused by fstat before a byte was read
    assert not (workspace / "inbox").exists()  # and nothing else of the run placed either
    with pytest.raises(StoreError):
        store.read_bytes(stored)


def test_a_failed_copy_removes_what_this_call_placed(
    store: FileStore, workspace: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    (workspace / "inbox").mkdir()
    (workspace / "inbox" / "keep.txt").write_text("the agent's")
    first = put(store, b"first", "first.txt")
    second = put(store, b"second", "second.txt")
    calls = {"n": 0}
    real = inbox_module._copy

    def failing_copy(source: int, target: int, stored: StoredFile) -> None:
        calls["n"] += 1
        if calls["n"] == 2:
            raise OSError(28, "No space left on device")
        real(source, target, stored)

    monkeypatch.setattr(inbox_module, "_copy", failing_copy)
    with pytest.raises(OSError):
        place_files(workspace, [first, second], store)
    assert sorted(os.listdir(workspace / "inbox")) == ["keep.txt"]


def test_a_content_file_cut_short_is_refused(store: FileStore, workspace: Path) -> None:
    stored = put(store, b"0123456789", "short.txt")
    other = StoredFile(**{**stored.__dict__, "size": 20})  # a row that says more than there is
    with pytest.raises(StoreError):
        place_files(workspace, [other], store)
    assert not (workspace / "inbox").exists()


@ROOT_ONLY
def test_placed_files_belong_to_the_containers_user(store: FileStore, workspace: Path) -> None:
    assert workspace_owner() == (1000, 1000)
    place_files(workspace, [put(store, b"x", "x.txt")], store)
    for entry in (workspace / "inbox", workspace / "inbox" / "x.txt"):
        st = os.lstat(entry)
        assert (st.st_uid, st.st_gid) == (1000, 1000), entry
    assert os.lstat(workspace).st_uid == 0  # the workspace itself is the pipeline's to hand over
    place_files(workspace, [put(store, b"y", "y.txt")], store, owner=(4321, 4322))
    st = os.lstat(workspace / "inbox" / "y.txt")
    assert (st.st_uid, st.st_gid) == (4321, 4322)
    assert os.lstat(workspace / "inbox").st_uid == 1000  # an existing inbox is left as it is
