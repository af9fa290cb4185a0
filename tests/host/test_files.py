"""The file store (orchestrator/store/files.py): stored once by content, sniffed from the
bytes, names made safe, limits per file and per group that leave nothing behind."""

from __future__ import annotations

import os
import secrets
import stat
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from orchestrator.core.errors import FileTooLarge, NotFound
from orchestrator.core.settings import Settings
from orchestrator.store.db import Database
from orchestrator.store.file_names import MAX_NAME_BYTES, numbered_names, safe_name, unique_name
from orchestrator.store.file_types import TYPES, Sniffer, sniff
from orchestrator.store.files import FileStore, chunks_of


def make_store(db: Database, settings: Settings, **limits: int) -> FileStore:
    store = FileStore.from_settings(db, settings)
    for name, value in limits.items():
        setattr(store, name, value)
    return store


def content_files(store: FileStore) -> list[Path]:
    """Every content file under the store's root (the temporary folder's too)."""
    return sorted(p for p in store.root.rglob("*") if p.is_file())


def row_count(db: Database) -> int:
    return int(db.read_fixed("SELECT COUNT(*) FROM files")[0][0])


# --- storing and reading back ----------------------------------------------------------------


def test_a_file_is_stored_and_read_back(db: Database, settings: Settings) -> None:
    store = make_store(db, settings)
    data = b"hello, files\n" * 1000
    stored = store.store("main@local", chunks_of(_Reader(data), 4096), "../notes.txt")
    assert stored.size == len(data) and stored.mime == "text/plain" and stored.name == "notes.txt"
    assert stored.chat_jid == stored.owner_jid == "main@local"
    import hashlib

    assert stored.sha256 == hashlib.sha256(data).hexdigest()
    again = store.get(stored.id)
    assert again == stored  # every column round-trips, the time as an aware UTC datetime
    assert again.created_at.tzinfo is not None
    assert store.read_bytes(again) == data
    assert store.list_chat("main@local") == [stored]
    with pytest.raises(NotFound):
        store.get(stored.id, chat_jid="other@local")  # another chat's file is not found
    with pytest.raises(NotFound):
        store.get("no-such-id")
    # Private like the data dir: folders 0700, the content 0600; no temporary file left.
    path = store.path_of(stored.sha256)
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert stat.S_IMODE(store.root.stat().st_mode) == 0o700
    assert stat.S_IMODE(path.parent.stat().st_mode) == 0o700
    assert content_files(store) == [path]


def test_ids_are_opaque_and_distinct(db: Database, settings: Settings) -> None:
    store = make_store(db, settings)
    ids = {store.store_bytes("main@local", b"same", "a.txt").id for _ in range(5)}
    assert len(ids) == 5
    assert all(len(i) >= 24 and "main" not in i for i in ids)


def test_the_same_bytes_are_stored_once_and_charged_to_the_first_chat(db: Database, settings: Settings) -> None:
    store = make_store(db, settings)
    first = store.store_bytes("a@local", b"\x89PNG\r\n\x1a\n" + b"x" * 100, "one.png")
    second = store.store_bytes("a@local", b"\x89PNG\r\n\x1a\n" + b"x" * 100, "two.png")
    third = store.store_bytes("b@local", b"\x89PNG\r\n\x1a\n" + b"x" * 100, "three.png")
    assert first.sha256 == second.sha256 == third.sha256
    assert len({first.id, second.id, third.id}) == 3
    assert [f.name for f in (first, second, third)] == ["one.png", "two.png", "three.png"]
    assert third.chat_jid == "b@local" and third.owner_jid == "a@local"
    assert content_files(store) == [store.path_of(first.sha256)]  # one content file
    assert row_count(db) == 3
    assert store.group_bytes("a@local") == 108  # once, however many references
    assert store.group_bytes("b@local") == 0


def test_a_file_over_the_limit_leaves_no_bytes_and_no_row(db: Database, settings: Settings) -> None:
    store = make_store(db, settings, max_bytes=10_000)
    fed = []

    def chunks() -> Iterator[bytes]:
        for i in range(1000):  # 1 MB offered, 1000 bytes at a time
            fed.append(i)
            yield b"y" * 1000

    with pytest.raises(FileTooLarge) as exc:
        store.store("main@local", chunks(), "big.bin")
    assert exc.value.limit == 10_000 and exc.value.setting == "file_max_bytes"
    assert "ORCHESTRATOR_FILE_MAX_BYTES" in str(exc.value)
    assert len(fed) == 11  # stopped at the chunk that passed the limit, not read to the end
    assert content_files(store) == [] and row_count(db) == 0
    # At the limit exactly is fine.
    assert store.store_bytes("main@local", b"z" * 10_000, "fits.bin").size == 10_000


def test_one_huge_chunk_is_cut_at_the_limit_too(db: Database, settings: Settings) -> None:
    store = make_store(db, settings, max_bytes=3 << 20)
    with pytest.raises(FileTooLarge):
        store.store_bytes("main@local", b"q" * (8 << 20), "huge.bin")
    assert content_files(store) == [] and row_count(db) == 0


def test_a_group_over_its_limit_stores_nothing_more(db: Database, settings: Settings) -> None:
    store = make_store(db, settings, group_max_bytes=2500)
    store.store_bytes("main@local", b"a" * 1000, "a.txt")
    store.store_bytes("main@local", b"b" * 1000, "b.txt")
    before = content_files(store)
    with pytest.raises(FileTooLarge) as exc:
        store.store_bytes("main@local", b"c" * 1000, "c.txt")
    assert exc.value.setting == "group_files_max_bytes" and exc.value.limit == 2500
    assert "ORCHESTRATOR_GROUP_FILES_MAX_BYTES" in str(exc.value)
    assert content_files(store) == before and row_count(db) == 2
    # What it stored before costs nothing more; another group has its own room.
    assert store.store_bytes("main@local", b"a" * 1000, "again.txt").owner_jid == "main@local"
    assert store.store_bytes("other@local", b"c" * 1000, "c.txt").owner_jid == "other@local"
    # And bytes another group stored first cost this one nothing.
    assert store.store_bytes("main@local", b"c" * 1000, "c.txt").owner_jid == "other@local"
    assert store.group_bytes("main@local") == 2000


def test_a_failed_insert_leaves_no_new_bytes(db: Database, settings: Settings, monkeypatch: pytest.MonkeyPatch) -> None:
    store = make_store(db, settings)
    first = store.store_bytes("main@local", b"first", "first.txt")
    monkeypatch.setattr(secrets, "token_urlsafe", lambda _n: first.id)  # the insert's id clashes
    with pytest.raises(Exception, match="(?i)unique|duplicate"):
        store.store_bytes("main@local", b"second", "second.txt")
    assert content_files(store) == [store.path_of(first.sha256)] and row_count(db) == 1
    with pytest.raises(Exception, match="(?i)unique|duplicate"):
        store.store_bytes("main@local", b"first", "again.txt")  # bytes that were there stay
    assert content_files(store) == [store.path_of(first.sha256)] and store.read_bytes(first) == b"first"


def test_uploads_at_once_never_pass_the_group_limit(db: Database, settings: Settings) -> None:
    store = make_store(db, settings, group_max_bytes=5000)
    errors: list[BaseException] = []

    def upload(i: int) -> None:
        try:
            store.store_bytes("main@local", bytes([i]) * 1000, f"{i}.bin")
        except FileTooLarge as exc:
            errors.append(exc)

    threads = [threading.Thread(target=upload, args=(i,)) for i in range(10)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert store.group_bytes("main@local") == 5000
    assert row_count(db) == 5 and len(errors) == 5
    assert len(content_files(store)) == 5  # and no temporary file left


# --- the type, from the bytes ----------------------------------------------------------------

HEADERS = {
    "image/png": b"\x89PNG\r\n\x1a\n\x00\x00\x00\rIHDR\x00\x00\x00\x01",
    "image/jpeg": b"\xff\xd8\xff\xe0\x00\x10JFIF\x00\x01\x01",
    "image/gif": b"GIF89a\x01\x00\x01\x00\x80\x00\x00",
    "image/webp": b"RIFF\x24\x00\x00\x00WEBPVP8 ",
    "application/pdf": b"%PDF-1.7\n%\xe2\xe3\xcf\xd3\n",
    "application/zip": b"PK\x03\x04\x14\x00\x00\x00\x08\x00",
}


@pytest.mark.parametrize(("mime", "header"), sorted(HEADERS.items()))
def test_real_headers_are_sniffed(mime: str, header: bytes) -> None:
    assert sniff(header + bytes(range(256))) == mime


@pytest.mark.parametrize(
    ("data", "mime"),
    [
        (b"just some words\n", "text/plain"),
        ("h\u00e9llo, w\u00f6rld \U0001f600".encode(), "text/plain"),
        (b"<html><script>alert(1)</script></html>", "text/plain"),  # never text/html
        (b'<svg xmlns="http://www.w3.org/2000/svg"><script>x()</script></svg>', "text/plain"),  # never SVG
        (b"text with a \x00 NUL", "application/octet-stream"),
        (b"\xff\xfe not utf-8", "application/octet-stream"),
        ("caf\u00e9".encode()[:-1], "application/octet-stream"),  # a character cut off at the end
        (b"RIFF\x24\x00\x00\x00WAVEfmt ", "application/octet-stream"),  # RIFF, but no WebP
        (b"RIFF1234WEBX", "text/plain"),
        (b"\x7fELF\x02\x01\x01\x00" + bytes(8), "application/octet-stream"),
    ],
)
def test_other_bytes_are_text_or_octets(data: bytes, mime: str) -> None:
    assert sniff(data) == mime
    assert sniff(data) in TYPES and "text/html" not in TYPES and "image/svg+xml" not in TYPES


def test_the_sniffer_sees_utf8_across_chunks_and_bad_bytes_late() -> None:
    text = "\u00e9" * 10
    sniffer = Sniffer()
    for i in range(len(text.encode())):
        sniffer.feed(text.encode()[i : i + 1])  # each two-byte character split in two
    assert sniffer.result() == "text/plain"
    png = Sniffer()
    for byte in HEADERS["image/png"]:
        png.feed(bytes([byte]))  # the magic number arrives a byte at a time
    assert png.result() == "image/png"
    late = Sniffer()
    late.feed(b"a" * 5000)
    late.feed(b"\xc3\x28")
    assert late.result() == "application/octet-stream"


def test_a_png_name_with_text_inside_is_text(db: Database, settings: Settings) -> None:
    store = make_store(db, settings)
    assert store.store_bytes("main@local", b"not a picture at all", "photo.png").mime == "text/plain"
    assert store.store_bytes("main@local", HEADERS["image/png"], "notes.txt").mime == "image/png"


# --- names -------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("raw", "safe"),
    [
        ("report.pdf", "report.pdf"),
        ("../../etc/passwd", "passwd"),
        ("..\\..\\windows\\system.ini", "system.ini"),
        ("/abs/path/x.txt", "x.txt"),
        ("..", "file"),
        ("../", "file"),
        ("", "file"),
        ("   ", "file"),
        (".bashrc", "bashrc"),
        ("...hidden.txt", "hidden.txt"),
        ("a\x00b.txt", "ab.txt"),
        ("line\nbreak\r.txt", "linebreak.txt"),
        ("\x1b[31mred.txt", "[31mred.txt"),
        ("evil\u202etxt.exe", "eviltxt.exe"),  # a bidi override that shows it as "exe.txt"
        ("\x00\x01\x02", "file"),
        ("trailing.", "trailing"),
        ("caf\u0065\u0301.txt", "caf\u00e9.txt"),  # NFC
    ],
)
def test_names_are_made_safe(raw: str, safe: str) -> None:
    assert safe_name(raw) == safe


def test_a_long_name_is_cut_to_120_bytes_keeping_its_extension() -> None:
    long = "a" * 300 + ".txt"
    cut = safe_name(long)
    assert cut == "a" * 116 + ".txt" and len(cut.encode()) == MAX_NAME_BYTES
    wide = "\u00e9" * 150 + ".pdf"  # 300 bytes of two-byte characters: never cut inside one
    cut = safe_name(wide)
    assert cut.endswith(".pdf") and len(cut.encode()) <= MAX_NAME_BYTES and "\ufffd" not in cut
    assert cut == "\u00e9" * 58 + ".pdf"
    no_ext = safe_name("b" * 300)
    assert no_ext == "b" * 120
    odd_ext = safe_name("c." + "d" * 300)  # an "extension" longer than a name's is none
    assert len(odd_ext.encode()) == MAX_NAME_BYTES and odd_ext.startswith("c.")


def test_numbered_names_stay_unique_and_short() -> None:
    names = list(numbered_names("notes.txt", 4))
    assert names == ["notes.txt", "notes (2).txt", "notes (3).txt", "notes (4).txt"]
    assert list(numbered_names("README", 2)) == ["README", "README (2)"]
    long = safe_name("x" * 300 + ".tar")
    for name in numbered_names(long, 1000):
        assert len(name.encode()) <= MAX_NAME_BYTES and name.endswith(".tar")
    assert len(set(numbered_names(long, 1000))) == 1000
    assert unique_name("a.txt", ["a.txt", "a (2).txt"]) == "a (3).txt"
    assert unique_name("a.txt", ["b.txt"]) == "a.txt"


class _Reader:
    def __init__(self, data: bytes) -> None:
        self._data = data
        self._at = 0

    def read(self, size: int, /) -> bytes:
        chunk = self._data[self._at : self._at + size]
        self._at += len(chunk)
        return chunk


def test_chunks_of_reads_a_file_object_in_pieces() -> None:
    assert list(chunks_of(_Reader(b"abcdefg"), 3)) == [b"abc", b"def", b"g"]


def test_the_content_path_takes_only_a_digest(tmp_path: Path) -> None:
    store = FileStore(None, tmp_path, max_bytes=1, group_max_bytes=1)  # type: ignore[arg-type]
    from orchestrator.core.errors import StoreError

    for bad in ("../../etc/passwd", "A" * 64, "0" * 63, ""):
        with pytest.raises(StoreError):
            store.path_of(bad)
    assert store.path_of("ab" * 32) == tmp_path / "ab" / ("ab" * 32)
    assert not os.listdir(tmp_path)


def test_the_limits_come_from_the_environment(tmp_path: Path) -> None:
    loaded = Settings.load(
        environ={"ORCHESTRATOR_FILE_MAX_BYTES": "1000", "ORCHESTRATOR_GROUP_FILES_MAX_BYTES": "5000"},
        env_file=None,
        data_dir=tmp_path,
    )
    store = FileStore.from_settings(None, loaded)  # type: ignore[arg-type]
    assert (store.max_bytes, store.group_max_bytes, store.root) == (1000, 5000, tmp_path / "files")
    defaults = Settings.load(environ={}, env_file=None)
    assert (defaults.files.max_bytes, defaults.files.group_files_max_bytes) == (25 << 20, 1 << 30)
    from orchestrator.core.errors import SettingsError

    with pytest.raises(SettingsError, match="ORCHESTRATOR_FILE_MAX_BYTES"):
        Settings.load(environ={"ORCHESTRATOR_FILE_MAX_BYTES": "0"}, env_file=None)


def test_a_zip_bomb_is_stored_and_placed_as_the_bytes_it_is(db: Database, settings: Settings, tmp_path: Path) -> None:
    # 200 MB of zeros in a zip of a few hundred kilobytes: the host never unpacks it.
    import io
    import zipfile

    from orchestrator.sandbox.inbox import place_files

    packed = io.BytesIO()
    with zipfile.ZipFile(packed, "w", zipfile.ZIP_DEFLATED) as archive:
        with archive.open("zeros.bin", "w", force_zip64=True) as member:
            for _ in range(200):
                member.write(b"\0" * (1 << 20))
    data = packed.getvalue()
    assert len(data) < 1 << 20
    store = make_store(db, settings)
    stored = store.store_bytes("bomb@test", data, "archive.zip")
    assert (stored.mime, stored.size) == ("application/zip", len(data))
    (placed,) = place_files(tmp_path, [stored], store, owner=(os.getuid(), os.getgid()))
    assert (tmp_path / placed.path).read_bytes() == data
    assert sorted(p.name for p in (tmp_path / "inbox").iterdir()) == ["archive.zip"]
