"""``orchestrator send --file`` and the files of ``send --wait``'s replies (orchestrator/cli/send.py,
cli/api_client.py), through a running API and in process, on both databases.

The real ``orchestrator`` executable against a real uvicorn server (``ORCHESTRATOR_API_URL``);
the replies a run would store are stored by the test while ``send --wait`` polls.
"""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import httpx
import pytest

from agent_runner.protocol import MAX_FILES_PER_MESSAGE
from orchestrator.cli.local_files import save_download
from orchestrator.core.settings import Settings
from orchestrator.http.api import create_app
from orchestrator.model.envelopes import files_of
from orchestrator.root import Orchestrator
from orchestrator.store.db import Database
from orchestrator.store.file_rows import StoredFile
from orchestrator.store.files import FileStore
from orchestrator.store.groups import add_group
from orchestrator.store.message_log import get_messages_after, now_iso, store_message_direct
from orchestrator.store.runs import create_run, finish_run
from tests.conftest import TEST_ENV, wait_until
from tests.live_server import serve

CLI = str(Path(sys.executable).parent / "orchestrator")
JID = "sendfiles@local"
PNG = b"\x89PNG\r\n\x1a\n" + bytes(range(200))


def _env(settings: Settings, **extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("ORCHESTRATOR_")}
    env.update(
        TEST_ENV,
        ORCHESTRATOR_DATA_DIR=str(settings.data_dir),
        ORCHESTRATOR_DATABASE_URL=settings.database_url,
        ORCHESTRATOR_LOG_LEVEL="WARNING",
        **extra,
    )
    return env


def _send(settings: Settings, *args: str, cwd: Path, **extra: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [CLI, "send", *args], env=_env(settings, **extra), capture_output=True, text=True, timeout=120, cwd=cwd
    )


@pytest.fixture
def group(db: Database) -> str:
    add_group(db, chat_jid=JID, name="files", folder="files", requires_trigger=False)
    return JID


@contextmanager
def _api(settings: Settings, **changes: Any) -> Iterator[str]:
    """The installation's API on a real server (its settings changed by ``changes``); its URL."""
    with serve(create_app(Orchestrator(settings.replace(**changes)))) as base:
        yield base


# Where `send` stores: through an API named by ORCHESTRATOR_API_URL, or in process.
WAYS = ["api", "in-process"]


@contextmanager
def _way(way: str, settings: Settings, **changes: Any) -> Iterator[dict[str, str]]:
    """The environment that makes `send` store ``way``, the installation's settings changed by ``changes``."""
    if way == "api":
        with _api(settings, **changes) as base:
            yield {"ORCHESTRATOR_API_URL": base}
        return
    yield {f"ORCHESTRATOR_{k.upper()}": str(v) for k, v in changes.items()}


def _rows(db: Database, settings: Settings) -> list[StoredFile]:
    return FileStore.from_settings(db, settings).list_chat(JID)


def _stored_files(settings: Settings) -> list[Path]:
    root = settings.files_dir
    return sorted(p for p in root.rglob("*") if not p.is_dir()) if root.exists() else []


# --- --file ----------------------------------------------------------------------------------


@pytest.mark.parametrize("way", WAYS)
def test_send_carries_its_files_in_a_file_envelope(
    db: Database, settings: Settings, group: str, tmp_path: Path, way: str
) -> None:
    (tmp_path / "notes.txt").write_text("what is in it\n")
    (tmp_path / "photo.png").write_bytes(PNG)
    with _way(way, settings) as extra:
        done = _send(
            settings,
            JID,
            "what is in them?",
            "--file",
            "notes.txt",
            "--file",
            str(tmp_path / "photo.png"),
            "--metadata",
            '{"source": "test"}',
            cwd=tmp_path,
            **extra,
        )
        assert done.returncode == 0, done.stderr
        [message] = get_messages_after(JID, 0, db=db)
        assert message.content == "what is in them?"
        meta = message.metadata or {}
        assert meta["message_type"] == "FILE" and meta["source"] == "test"
        payload = files_of(meta)
        assert payload is not None
        refs = payload.files
        assert [(r.name, r.mime) for r in refs] == [("notes.txt", "text/plain"), ("photo.png", "image/png")]
        store = FileStore.from_settings(db, settings)
        assert [store.read_bytes(store.get(r.id, JID)) for r in refs] == [b"what is in it\n", PNG]
        if way == "api":  # and the API serves them
            base = extra["ORCHESTRATOR_API_URL"]
            assert httpx.get(f"{base}/api/files/{refs[1].id}").content == PNG


@pytest.mark.parametrize("way", WAYS)
def test_a_missing_or_unreadable_path_is_an_error_before_anything_is_sent(
    db: Database, settings: Settings, group: str, tmp_path: Path, way: str
) -> None:
    (tmp_path / "good.txt").write_text("fine")
    os.mkfifo(tmp_path / "pipe")  # never waited on
    (tmp_path / "folder").mkdir()
    with _way(way, settings) as extra:
        for bad, words in (
            ("missing.txt", "No such file"),
            ("pipe", "not a regular file"),
            ("folder", "not a regular"),
        ):
            done = _send(settings, JID, "hi", "--file", "good.txt", "--file", bad, cwd=tmp_path, **extra)
            assert done.returncode == 1
            assert f"--file {bad}" in done.stderr and words in done.stderr and "nothing was sent" in done.stderr
        many = ["--file", "good.txt"] * (MAX_FILES_PER_MESSAGE + 1)
        done = _send(settings, JID, "hi", *many, cwd=tmp_path, **extra)
        assert done.returncode == 1 and f"at most {MAX_FILES_PER_MESSAGE}" in done.stderr
        done = _send(
            settings, JID, "hi", "--file", "good.txt", "--metadata", '{"message_type": "TODO"}', cwd=tmp_path, **extra
        )
        assert done.returncode == 1 and "not an envelope" in done.stderr
    assert get_messages_after(JID, 0, db=db) == []
    assert _rows(db, settings) == [] and _stored_files(settings) == []


@pytest.mark.parametrize("way", WAYS)
def test_a_file_over_the_limit_sends_nothing(
    db: Database, settings: Settings, group: str, tmp_path: Path, way: str
) -> None:
    (tmp_path / "small.txt").write_text("small")
    (tmp_path / "big.bin").write_bytes(b"\x00" * 5000)
    with _way(way, settings, file_max_bytes=4096) as extra:
        done = _send(settings, JID, "hi", "--file", "small.txt", "--file", "big.bin", cwd=tmp_path, **extra)
    assert done.returncode == 1
    assert "4096 bytes" in done.stderr and "ORCHESTRATOR_FILE_MAX_BYTES" in done.stderr
    if way == "api":
        assert "413" in done.stderr
    assert get_messages_after(JID, 0, db=db) == []
    assert _rows(db, settings) == [] and _stored_files(settings) == []


@pytest.mark.parametrize("way", WAYS)
def test_files_for_an_unregistered_chat_are_refused(db: Database, settings: Settings, tmp_path: Path, way: str) -> None:
    (tmp_path / "a.txt").write_text("a")
    with _way(way, settings) as extra:
        done = _send(settings, "nobody@local", "hi", "--file", "a.txt", cwd=tmp_path, **extra)
    assert done.returncode == 1 and "no registered group for chat 'nobody@local'" in done.stderr
    assert get_messages_after("nobody@local", 0, db=db) == [] and _stored_files(settings) == []


# --- send --wait saves the replies' files ----------------------------------------------------


def _reply_with_file(db: Database, settings: Settings, data: bytes, shown_name: str) -> StoredFile:
    """What a run that answers the one message of the chat with a file stores: the file, an
    assistant message whose FILE envelope names it ``shown_name``, the run finished."""
    [asked] = get_messages_after(JID, 0, db=db)
    stored = FileStore.from_settings(db, settings).store_bytes(JID, data, "report.txt")
    envelope = {
        "message_type": "FILE",
        "version": 1,
        "payload": {"files": [{"id": stored.id, "name": shown_name, "mime": stored.mime, "size": stored.size}]},
    }
    run = create_run(db, chat_jid=JID, cursor_from=0, cursor_to=asked.seq, celery_task_id=None)
    store_message_direct(
        db=db,
        id="reply-1",
        chat_jid=JID,
        sender="bot",
        sender_name="Andy",
        content="here it is",
        timestamp=now_iso(),
        is_from_me=True,
        message_type="assistant",
        metadata=envelope,
    )
    finish_run(db, run.id, state="succeeded")
    return stored


@pytest.mark.parametrize("way", WAYS)
def test_send_wait_saves_a_replys_file_inside_the_downloads_folder(
    db: Database, settings: Settings, group: str, tmp_path: Path, way: str
) -> None:
    work = tmp_path / "work"
    downloads = work / "downloads"
    downloads.mkdir(parents=True)
    (downloads / "x").write_text("mine, keep it")  # the name is taken: never overwritten
    with _way(way, settings) as extra:
        proc = subprocess.Popen(
            [CLI, "send", JID, "/send-file report", "--wait", "60"],
            env=_env(settings, **extra),
            cwd=work,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        try:
            wait_until(lambda: len(get_messages_after(JID, 0, db=db)) == 1, 30, "the message to be stored")
            # The store makes the names it keeps safe; a reply whose envelope names its file
            # "../../x" anyway (an older row, another writer) must still land inside the folder.
            _reply_with_file(db, settings, b"the report\n", "../../x")
            out, err = proc.communicate(timeout=60)
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
    assert proc.returncode == 0, err
    assert (downloads / "x").read_text() == "mine, keep it"
    assert (downloads / "x (2)").read_bytes() == b"the report\n"
    assert not (tmp_path / "x").exists() and not (work / "x").exists()
    assert sorted(p.name for p in downloads.iterdir()) == ["x", "x (2)"]
    assert "[assistant] Andy: here it is" in out
    assert f"saved ../../x (text/plain, 11 B) to {Path('downloads') / 'x (2)'}" in out


# --- the download's name, on its own -------------------------------------------------------------


def _fetch(data: bytes) -> Callable[[Callable[[bytes], object]], int]:
    def fetch(write: Callable[[bytes], object]) -> int:
        write(data)
        return len(data)

    return fetch


def test_a_download_never_leaves_its_folder_nor_replaces_nor_follows_a_link(tmp_path: Path) -> None:
    folder = tmp_path / "downloads"
    outside = tmp_path / "outside.txt"
    outside.write_text("not yours")
    # Made if missing; a hostile name lands inside, made safe.
    assert save_download(folder, "../../x", _fetch(b"1")) == folder / "x"
    assert save_download(folder, "/etc/passwd", _fetch(b"2")) == folder / "passwd"
    assert save_download(folder, ".bashrc", _fetch(b"3")) == folder / "bashrc"
    assert save_download(folder, "a\x00b\u202e.txt", _fetch(b"4")) == folder / "ab.txt"
    # Taken names are numbered, never replaced.
    assert save_download(folder, "x", _fetch(b"5")) == folder / "x (2)"
    assert (folder / "x").read_bytes() == b"1" and (folder / "x (2)").read_bytes() == b"5"
    # A link planted at the name is neither followed nor replaced.
    (folder / "link.txt").symlink_to(outside)
    assert save_download(folder, "link.txt", _fetch(b"6")) == folder / "link (2).txt"
    assert outside.read_text() == "not yours" and (folder / "link.txt").is_symlink()

    # A download that fails leaves no file.
    def broken(write: Callable[[bytes], object]) -> int:
        write(b"half")
        raise OSError("the connection broke")

    with pytest.raises(OSError):
        save_download(folder, "broken.bin", broken)
    assert not (folder / "broken.bin").exists()


def test_send_with_files_through_the_api_imports_no_store(
    db: Database, settings: Settings, group: str, tmp_path: Path
) -> None:
    """--file keeps `send` under its start-up target (tests/host/test_send.py holds the plain send to it)."""
    (tmp_path / "a.txt").write_text("a")
    probe = (
        f"import sys; sys.argv = ['orchestrator', 'send', {JID!r}, 'probe', '--file', 'a.txt']\n"
        "from orchestrator.cli.entry import main\n"
        "try:\n    main()\nexcept SystemExit:\n    pass\n"
        "heavy = sorted(m for m in ('sqlalchemy', 'alembic', 'celery', 'kombu', 'pydantic', 'pydantic_settings',"
        " 'typer', 'httpx', 'docker') if m in sys.modules)\n"
        "print('HEAVY', heavy)\n"
    )
    with _api(settings) as base:
        done = subprocess.run(
            [sys.executable, "-c", probe],
            env=_env(settings, ORCHESTRATOR_API_URL=base),
            capture_output=True,
            text=True,
            timeout=60,
            cwd=tmp_path,
        )
    assert done.returncode == 0, done.stderr
    assert "HEAVY []" in done.stdout, done.stdout
    [message] = get_messages_after(JID, 0, db=db)
    payload = files_of(message.metadata)
    assert payload is not None and [r.name for r in payload.files] == ["a.txt"]
