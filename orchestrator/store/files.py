"""Files people send and agents hand back (issue 31): stored once by content, named safely.

**Where the bytes live.**  Under ``<data_dir>/files`` (:attr:`Settings.files_dir`, this
user's alone like the rest of the data dir: folders 0700, files 0600), once per content,
at ``<sha256[:2]>/<sha256>``, so every host of a fleet that shares the data dir sees them.
An upload streams into a temporary file under ``tmp/`` in chunks (never whole in memory),
counted and hashed as it comes and stopped past ``ORCHESTRATOR_FILE_MAX_BYTES``; only a
complete file is renamed into place (a rename within one file system: no reader ever
sees part of one).  What is refused leaves neither bytes nor a row.

**The rows.**  ``files`` has a row per reference (a chat storing a file): an opaque,
unguessable id, the content's SHA-256 and size, the MIME type sniffed from the bytes, the
sender's name made safe, the referring chat, the chat that stored the content first
(``owner_jid``) and the time.  A group's files count against
``ORCHESTRATOR_GROUP_FILES_MAX_BYTES`` by the contents it stored first (each once): storing
what another chat stored before costs nothing more.  The check and the insert run under the
database's write lock (SQLite's ``BEGIN IMMEDIATE``; PostgreSQL's transaction-scoped
advisory lock 726935), so two uploads at once cannot both take the last room.

**The type is sniffed** (:func:`sniff`) from the first bytes against a table of magic
numbers for the types that matter (PNG, JPEG, GIF, WebP, PDF, ZIP), else ``text/plain`` for
bytes that are all valid UTF-8 with no NUL, else ``application/octet-stream``.  The sender's
type and the name's extension are never asked.  A table, not a library: a general sniffer
(libmagic, ``puremagic``, ``filetype``) also answers ``text/html`` and ``image/svg+xml``,
which a browser runs as code when served inline; this one can answer only the types above,
so no stored file ever claims either (HTML or SVG is ``text/plain`` here).  Serving
(later) must still send ``Content-Disposition: attachment`` and ``nosniff``, and preview
inline only the raster image types.

**Names** (:func:`safe_name`, :func:`numbered_names`): the sender's name is a hint, never a
path: directories, control and format characters and leading dots go, it is cut to
:data:`MAX_NAME_BYTES` of UTF-8 keeping its extension, and it is never empty.
"""

from __future__ import annotations

import codecs
import errno
import hashlib
import os
import secrets
import stat
import time
import unicodedata
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any, Protocol

import msgspec

from orchestrator.core.errors import FileTooLarge, InvalidMessageMetadata, NotFound, StoreError
from orchestrator.core.jsontypes import JsonObject
from orchestrator.core.settings import Settings, private_dir
from orchestrator.model.envelopes import (
    ENVELOPE_KEYS,
    FILE,
    FilePayload,
    FileRef,
    build_structured_envelope,
    files_of,
)
from orchestrator.store.db import Connection, Database, db_now, db_time, driver_execute

# --- names -------------------------------------------------------------------------------

MAX_NAME_BYTES = 120
DEFAULT_NAME = "file"
# An extension longer than this is no extension (it is cut with the rest of the name).
_MAX_EXT_BYTES = 16
# Unicode categories that never stay in a name: controls (NUL, newlines, escapes), format
# characters (bidi overrides that show "exe.txt" as "txt.exe", zero-width ones), surrogates
# (a name decoded with surrogateescape), private use and unassigned.
_DROPPED_CATEGORIES = frozenset({"Cc", "Cf", "Cs", "Co", "Cn"})


def _cut(text: str, max_bytes: int) -> str:
    """``text`` cut to at most ``max_bytes`` of UTF-8, never inside a character."""
    return text.encode("utf-8")[:max_bytes].decode("utf-8", "ignore")


def _split_ext(name: str) -> tuple[str, str]:
    stem, dot, ext = name.rpartition(".")
    if not dot or not stem or not ext or len(ext.encode("utf-8")) > _MAX_EXT_BYTES:
        return name, ""
    return stem, "." + ext


def _fit(stem: str, tail: str) -> str:
    """``stem`` cut so that ``stem + tail`` fits :data:`MAX_NAME_BYTES`."""
    room = MAX_NAME_BYTES - len(tail.encode("utf-8"))
    return _cut(stem, max(room, 0)).rstrip(" .") + tail


def safe_name(raw: str) -> str:
    """A sender's file name made safe to create in a folder, and to show.

    The last component of either kind of path (``/`` and ``\\``): ``../../etc/passwd`` is
    ``passwd``; no control, format, surrogate or unassigned character (NUL, newlines, bidi
    overrides); NFC; no leading dots or spaces (``.bashrc`` is ``bashrc``, ``..`` is nothing),
    no trailing ones; at most :data:`MAX_NAME_BYTES` bytes of UTF-8, cut from the stem so the
    extension stays; never empty (:data:`DEFAULT_NAME`)."""
    name = raw.replace("\\", "/").rsplit("/", 1)[-1]
    name = "".join(ch for ch in name if unicodedata.category(ch) not in _DROPPED_CATEGORIES)
    name = unicodedata.normalize("NFC", name)
    name = "".join(ch for ch in name if unicodedata.category(ch) not in _DROPPED_CATEGORIES)
    name = name.lstrip(". ").rstrip(". ")
    if len(name.encode("utf-8")) > MAX_NAME_BYTES:
        stem, ext = _split_ext(name)
        name = _fit(stem, ext) if stem.strip(" .") else _cut(name, MAX_NAME_BYTES)
        name = name.lstrip(". ").rstrip(". ")
    return name or DEFAULT_NAME


def numbered_names(name: str, limit: int = 1000) -> Iterator[str]:
    """``name`` (a :func:`safe_name`), then ``name (2).ext``, ``name (3).ext``, ... up to
    ``limit`` names, each within :data:`MAX_NAME_BYTES`: the names to try, in order, when
    creating a file that must not replace one already there (the caller creates each with
    ``O_EXCL``: a name is taken or not at the moment of creation, never checked before)."""
    yield name
    stem, ext = _split_ext(name)
    for n in range(2, limit + 1):
        yield _fit(stem, f" ({n}){ext}")


def unique_name(name: str, taken: Iterable[str]) -> str:
    """The first of :func:`numbered_names` not in ``taken`` (for a listing; a folder that
    others write to takes :func:`numbered_names` with ``O_EXCL`` instead)."""
    used = set(taken)
    for candidate in numbered_names(name):
        if candidate not in used:
            return candidate
    raise StoreError(f"{name!r}: every numbered name is taken")


# --- the type, from the bytes ------------------------------------------------------------

OCTET_STREAM = "application/octet-stream"
TEXT = "text/plain"
# (offset, magic, type): the types that matter, as their formats' specifications start them.
MAGIC: tuple[tuple[int, bytes, str], ...] = (
    (0, b"\x89PNG\r\n\x1a\n", "image/png"),  # PNG signature (RFC 2083)
    (0, b"\xff\xd8\xff", "image/jpeg"),  # JPEG SOI + the first marker's 0xFF
    (0, b"GIF87a", "image/gif"),
    (0, b"GIF89a", "image/gif"),
    (0, b"%PDF-", "application/pdf"),
    (0, b"PK\x03\x04", "application/zip"),  # a local file header (also docx, xlsx, jar, ...)
    (0, b"PK\x05\x06", "application/zip"),  # an empty archive's end record
)
# WebP: a RIFF container ("RIFF", 4 bytes of size, "WEBP").
_WEBP = ((0, b"RIFF"), (8, b"WEBP"))
SNIFF_BYTES = 16
# The only types sniff() answers: never text/html or image/svg+xml (see the module's docstring).
TYPES = frozenset({t for _, _, t in MAGIC} | {"image/webp", TEXT, OCTET_STREAM})
# Raster images a page may one day show inline (never SVG: it runs scripts).
INLINE_IMAGE_TYPES = frozenset({"image/png", "image/jpeg", "image/gif", "image/webp"})


class Sniffer:
    """The type of bytes fed in pieces, as they stream: the magic numbers of the first
    :data:`SNIFF_BYTES`, else UTF-8 validity (and no NUL) of the whole, incrementally."""

    def __init__(self) -> None:
        self._head = b""
        self._text = True
        self._decoder = codecs.getincrementaldecoder("utf-8")("strict")

    def feed(self, chunk: bytes) -> None:
        if len(self._head) < SNIFF_BYTES:
            self._head += chunk[: SNIFF_BYTES - len(self._head)]
        if self._text:
            try:
                self._decoder.decode(chunk)
            except UnicodeDecodeError:
                self._text = False
            else:
                self._text = b"\x00" not in chunk

    def result(self) -> str:
        head = self._head
        for offset, magic, mime in MAGIC:
            if head[offset : offset + len(magic)] == magic:
                return mime
        if all(head[o : o + len(m)] == m for o, m in _WEBP):
            return "image/webp"
        if self._text:
            try:
                self._decoder.decode(b"", final=True)  # a character cut off at the end is no text
            except UnicodeDecodeError:
                return OCTET_STREAM
            return TEXT
        return OCTET_STREAM


def sniff(data: bytes) -> str:
    """The MIME type of ``data``, from its bytes alone (one of :data:`TYPES`)."""
    sniffer = Sniffer()
    sniffer.feed(data)
    return sniffer.result()


# --- the store ---------------------------------------------------------------------------

CHUNK_BYTES = 1 << 20
_PRIVATE_FILE = 0o600
# PostgreSQL: one upload's check-and-insert at a time in the whole fleet (they are rare,
# and the bytes are on disk before the lock is taken).  SQLite: the write lock already is.
_PG_FILES_LOCK = "SELECT pg_advisory_xact_lock(726935)"
_COLUMNS = "id, chat_jid, sha256, size, mime, name, owner_jid, created_at"
# A file no live message names: none, or only superseded or deleted ones (message_files
# rows outlive the messages an unregistered chat's window deletes).
_UNREFERENCED = (
    "SELECT f.id, f.chat_jid, f.sha256, f.size, f.mime, f.name, f.owner_jid, f.created_at FROM files f "
    "WHERE f.created_at < :cutoff {chat} AND NOT EXISTS (SELECT 1 FROM message_files mf "
    "JOIN messages m ON m.chat_jid = mf.chat_jid AND m.id = mf.message_id "
    "WHERE mf.file_id = f.id AND m.superseded_at IS NULL) ORDER BY f.created_at, f.id LIMIT :limit"
)


@dataclass(frozen=True)
class StoredFile:
    """A file as a chat stored it (a row of ``files``)."""

    id: str
    chat_jid: str
    sha256: str
    size: int
    mime: str
    name: str
    owner_jid: str  # the chat that stored these bytes first
    created_at: datetime


def _row(row: Any) -> StoredFile:
    id_, chat_jid, sha256, size, mime, name, owner_jid, created_at = row
    created = db_time(created_at)
    assert created is not None
    return StoredFile(str(id_), str(chat_jid), str(sha256), int(size), str(mime), str(name), str(owner_jid), created)


class Readable(Protocol):
    def read(self, size: int, /) -> bytes: ...


def chunks_of(stream: Readable, size: int = CHUNK_BYTES) -> Iterator[bytes]:
    """The bytes of a file object, ``size`` at a time (never the whole in memory)."""
    while chunk := stream.read(size):
        yield bytes(chunk)


class FileStore:
    """Files stored once by content under ``root``, with a row per chat's reference in ``db``."""

    def __init__(self, db: Database, root: Path, *, max_bytes: int, group_max_bytes: int) -> None:
        self.db = db
        self.root = root
        self.max_bytes = max_bytes
        self.group_max_bytes = group_max_bytes

    @classmethod
    def from_settings(cls, db: Database, settings: Settings) -> FileStore:
        return cls(
            db, settings.files_dir, max_bytes=settings.file_max_bytes, group_max_bytes=settings.group_files_max_bytes
        )

    def path_of(self, sha256: str) -> Path:
        """Where the bytes of ``sha256`` live (a hex digest, checked: it names a path)."""
        if len(sha256) != 64 or any(c not in "0123456789abcdef" for c in sha256):
            raise StoreError(f"{sha256!r} is no SHA-256 digest")
        return self.root / sha256[:2] / sha256

    # -- storing ----------------------------------------------------------------------

    def store(self, chat_jid: str, chunks: Iterable[bytes], name: str) -> StoredFile:
        """Store the bytes ``chunks`` yields as a file of ``chat_jid`` named ``name`` (made
        safe); returns its row.  Raises :class:`FileTooLarge` past either limit, having kept
        nothing (no bytes, no row)."""
        private_dir(self.root)
        tmp_dir = private_dir(self.root / "tmp")
        fd, tmp = _temp_file(tmp_dir)
        try:
            sha256, size, mime = self._stream(fd, chunks)
            os.fsync(fd)
        except BaseException:
            os.close(fd)
            _unlink(tmp)
            raise
        os.close(fd)
        try:
            return self._commit(chat_jid, tmp, sha256, size, mime, safe_name(name))
        finally:
            _unlink(tmp)  # renamed into place, or not wanted: gone either way

    def store_bytes(self, chat_jid: str, data: bytes, name: str) -> StoredFile:
        return self.store(chat_jid, [data], name)

    # -- keeping ----------------------------------------------------------------------

    def unreferenced(self, grace_s: float, *, chat_jid: str | None = None, limit: int = 500) -> list[StoredFile]:
        """Files stored more than ``grace_s`` ago (by the database's clock) that no live
        message names (none, or only superseded or deleted ones), oldest first: what
        :meth:`prune` frees.  The grace covers an upload whose message is still to come."""
        with self.db.engine.connect() as conn:
            cutoff = _db_value(conn, db_now(conn) - timedelta(seconds=grace_s))
            sql = _UNREFERENCED.format(chat="AND f.chat_jid = :chat_jid" if chat_jid is not None else "")
            params: dict[str, object] = {"cutoff": cutoff, "limit": limit}
            if chat_jid is not None:
                params["chat_jid"] = chat_jid
            return [_row(r) for r in driver_execute(conn, sql, params).fetchall()]

    def prune(self, grace_s: float, *, chat_jid: str | None = None) -> list[StoredFile]:
        """Free the :meth:`unreferenced` files (their rows, and their bytes once no row is
        left), and uploads cut off mid-way (``tmp/``) older than ``grace_s``; returns the
        files freed.  Bounded per call: a sweep calls it again."""
        freed = self.unreferenced(grace_s, chat_jid=chat_jid)
        self.discard(freed)
        self._prune_tmp(grace_s)
        return freed

    def remove(self, chat_jid: str, file_id: str) -> StoredFile:
        """Free the file ``file_id`` of ``chat_jid`` now, named by messages or not (they keep
        naming it; serving it is then a 404).  Raises :class:`NotFound`."""
        stored = self.get(file_id, chat_jid)
        self.discard([stored])
        return stored

    def _prune_tmp(self, grace_s: float) -> None:
        tmp = self.root / "tmp"
        try:
            entries = list(os.scandir(tmp))
        except FileNotFoundError:
            return
        # This host's clock: a partial upload's file is this host's own, written by its process.
        cutoff = time.time() - grace_s
        for entry in entries:
            if entry.name.startswith((".upload-", ".discard-")) and entry.stat(follow_symlinks=False).st_mtime < cutoff:
                _unlink(Path(entry.path))

    def discard(self, files: Iterable[StoredFile]) -> None:
        """Take back files just stored that their request cannot keep (an upload of several
        refused at a later one: orchestrator/http/routes/files.py): each row goes, and so do
        the bytes no other row refers to.  Content that another chat's row still names stays,
        and counts from now on against the first chat that still refers to it.  Under the
        lock :meth:`store` takes, so an upload of the same bytes meanwhile either finds them
        in place with its row in, or stores them again."""
        for stored in files:
            self._discard(stored)

    def _discard(self, stored: StoredFile) -> None:
        path = self.path_of(stored.sha256)
        aside: Path | None = None
        try:
            with self.db.transaction() as conn:
                if not self.db.is_sqlite:
                    driver_execute(conn, _PG_FILES_LOCK)
                driver_execute(conn, "DELETE FROM files WHERE id = :id", {"id": stored.id})
                left = driver_execute(
                    conn,
                    "SELECT chat_jid, owner_jid FROM files WHERE sha256 = :sha256 ORDER BY created_at, id",
                    {"sha256": stored.sha256},
                ).fetchall()
                if not left:
                    # Moved aside, not unlinked, until the delete commits: a failed commit puts it back.
                    if os.path.lexists(path):
                        aside = private_dir(self.root / "tmp") / f".discard-{secrets.token_hex(12)}"
                        os.rename(path, aside)
                elif all(str(owner) == stored.chat_jid for _, owner in left) and stored.chat_jid not in {
                    str(chat) for chat, _ in left
                }:
                    driver_execute(
                        conn,
                        "UPDATE files SET owner_jid = :owner WHERE sha256 = :sha256",
                        {"owner": str(left[0][0]), "sha256": stored.sha256},
                    )
        except BaseException:
            if aside is not None:
                os.rename(aside, path)
            raise
        if aside is not None:
            _unlink(aside)

    def _stream(self, fd: int, chunks: Iterable[bytes]) -> tuple[str, int, str]:
        digest = hashlib.sha256()
        sniffer = Sniffer()
        size = 0
        for chunk in chunks:
            for start in range(0, len(chunk), CHUNK_BYTES):
                piece = chunk[start : start + CHUNK_BYTES]
                size += len(piece)
                if size > self.max_bytes:
                    raise FileTooLarge(
                        f"the file is larger than {self.max_bytes} bytes", self.max_bytes, "file_max_bytes"
                    )
                digest.update(piece)
                sniffer.feed(piece)
                view = memoryview(piece)
                while view:
                    view = view[os.write(fd, view) :]
        return digest.hexdigest(), size, sniffer.result()

    def _commit(self, chat_jid: str, tmp: Path, sha256: str, size: int, mime: str, name: str) -> StoredFile:
        final = self.path_of(sha256)
        placed = False
        try:
            with self.db.transaction() as conn:
                if not self.db.is_sqlite:
                    driver_execute(conn, _PG_FILES_LOCK)
                owner = driver_execute(
                    conn, "SELECT owner_jid FROM files WHERE sha256 = :sha256 LIMIT 1", {"sha256": sha256}
                ).fetchone()
                owner_jid = chat_jid if owner is None else str(owner[0])
                if owner is None:
                    used = group_bytes(conn, chat_jid)
                    if used + size > self.group_max_bytes:
                        raise FileTooLarge(
                            f"the group's files take {used} bytes; {size} more would pass its limit",
                            self.group_max_bytes,
                            "group_files_max_bytes",
                        )
                if not final.exists():
                    private_dir(final.parent)
                    os.rename(tmp, final)
                    placed = True
                row = StoredFile(
                    id=new_file_id(),
                    chat_jid=chat_jid,
                    sha256=sha256,
                    size=size,
                    mime=mime,
                    name=name,
                    owner_jid=owner_jid,
                    created_at=db_now(conn),
                )
                driver_execute(
                    conn,
                    f"INSERT INTO files ({_COLUMNS}) VALUES "
                    "(:id, :chat_jid, :sha256, :size, :mime, :name, :owner_jid, :created_at)",
                    {**row.__dict__, "created_at": _db_value(conn, row.created_at)},
                )
            return row
        except BaseException:
            if placed:
                # Bytes no row refers to: only this upload could have put them there (the lock).
                _unlink(final)
            raise

    # -- reading ----------------------------------------------------------------------

    def get(self, file_id: str, chat_jid: str | None = None) -> StoredFile:
        """The file ``file_id`` (of ``chat_jid``, when given: another chat's is not found)."""
        sql = f"SELECT {_COLUMNS} FROM files WHERE id = :id"
        params: dict[str, object] = {"id": file_id}
        if chat_jid is not None:
            sql += " AND chat_jid = :chat_jid"
            params["chat_jid"] = chat_jid
        rows = self.db.read_fixed(sql, params)
        if not rows:
            raise NotFound(f"no file {file_id!r}" + (f" in {chat_jid}" if chat_jid else ""))
        return _row(rows[0])

    def list_chat(self, chat_jid: str) -> list[StoredFile]:
        """The files ``chat_jid`` stored, oldest first."""
        rows = self.db.read_fixed(
            f"SELECT {_COLUMNS} FROM files WHERE chat_jid = :chat_jid ORDER BY created_at, id", {"chat_jid": chat_jid}
        )
        return [_row(r) for r in rows]

    def group_bytes(self, chat_jid: str) -> int:
        """The bytes counted against ``chat_jid``'s limit: the contents it stored first."""
        with self.db.engine.connect() as conn:
            return group_bytes(conn, chat_jid)

    def open_content(self, stored: StoredFile) -> int:
        """A read descriptor of ``stored``'s bytes, checked to be a regular file of exactly
        the size its row records (by ``fstat``, before any byte is read): a content file
        that is not what was stored is an error, never read on."""
        path = self.path_of(stored.sha256)
        try:
            fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
        except OSError as exc:
            raise StoreError(f"file {stored.id}: its content is missing or unreadable ({exc.strerror})") from None
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode) or st.st_size != stored.size:
            os.close(fd)
            raise StoreError(
                f"file {stored.id}: its content is {st.st_size} bytes, not the {stored.size} stored; not read"
            )
        return fd

    def write_to(self, stored: StoredFile, write: Callable[[bytes], object]) -> int:
        """Hand ``stored``'s bytes to ``write`` a chunk at a time (never whole in memory); the
        bytes handed (fewer than its size only if its content ended early)."""
        fd = self.open_content(stored)
        try:
            left = stored.size
            while left > 0 and (chunk := os.read(fd, min(left, CHUNK_BYTES))):
                write(chunk)
                left -= len(chunk)
        finally:
            os.close(fd)
        return stored.size - left

    def read_bytes(self, stored: StoredFile) -> bytes:
        """The whole of a stored file (bounded: its recorded size, itself within the limit)."""
        fd = self.open_content(stored)
        try:
            parts: list[bytes] = []
            left = stored.size
            while left > 0:
                chunk = os.read(fd, min(left, CHUNK_BYTES))
                if not chunk:
                    break
                parts.append(chunk)
                left -= len(chunk)
            data = b"".join(parts)
        finally:
            os.close(fd)
        if len(data) != stored.size:
            raise StoreError(f"file {stored.id}: its content ended after {len(data)} of {stored.size} bytes")
        return data


# --- messages that name files ------------------------------------------------------------


def file_ref(stored: StoredFile) -> FileRef:
    """How a message names ``stored`` (its FILE envelope's entry)."""
    return FileRef(id=stored.id, name=stored.name, mime=stored.mime, size=stored.size)


def file_envelope(files: Sequence[StoredFile], *, extras: JsonObject | None = None) -> JsonObject:
    """The metadata of a message that carries ``files`` (a FILE envelope)."""
    payload = FilePayload(files=[file_ref(f) for f in files])
    return build_structured_envelope(FILE, msgspec.to_builtins(payload), extras=extras)


def checked_files(conn: Connection, chat_jid: str, metadata: JsonObject | None) -> JsonObject | None:
    """In the caller's transaction: ``metadata`` with its FILE envelope's entries as this
    store has them (name, type and size from the rows, not from the sender or the export),
    or ``metadata`` itself when it carries no files.  Every id must name a file of
    ``chat_jid``, once: a forged reference (another chat's file, an id that was never
    stored) is refused with :class:`InvalidMessageMetadata` naming the entry, and nothing
    is stored."""
    files = files_of(metadata)
    if files is None:
        return metadata
    assert metadata is not None
    ids = [ref.id for ref in files.files]
    params = {f"id{i}": ref_id for i, ref_id in enumerate(ids)}
    rows = driver_execute(
        conn,
        f"SELECT {_COLUMNS} FROM files WHERE chat_jid = :chat_jid AND id IN ({', '.join(':' + k for k in params)})",
        {"chat_jid": chat_jid, **params},
    ).fetchall()
    found = {row.id: row for row in map(_row, rows)}
    seen: set[str] = set()
    for i, ref_id in enumerate(ids):
        where = f"metadata.payload.files[{i}].id"
        if ref_id in seen:
            raise InvalidMessageMetadata(where, f"names file {ref_id!r} a second time")
        if ref_id not in found:
            raise InvalidMessageMetadata(where, f"names no file of chat {chat_jid!r} (upload it to this chat first)")
        seen.add(ref_id)
    extras = {k: v for k, v in metadata.items() if k not in ENVELOPE_KEYS}
    return file_envelope([found[ref_id] for ref_id in ids], extras=extras)


def group_bytes(conn: Connection, chat_jid: str) -> int:
    """In the caller's transaction: the bytes of the contents ``chat_jid`` stored first, each once."""
    row = driver_execute(
        conn,
        "SELECT COALESCE(SUM(size), 0) FROM "
        "(SELECT DISTINCT sha256, size FROM files WHERE owner_jid = :chat_jid) AS owned",
        {"chat_jid": chat_jid},
    ).fetchone()
    return int(row[0])


def _db_value(conn: Connection, value: datetime) -> object:
    # SQLite stores UTC text as the ORM's UTCDateTime does (six-digit fraction, no zone).
    if conn.dialect.name == "sqlite":
        return value.replace(tzinfo=None).isoformat(sep=" ", timespec="microseconds")
    return value


def _temp_file(folder: Path) -> tuple[int, Path]:
    for _ in range(100):
        path = folder / f".upload-{secrets.token_hex(12)}"
        try:
            return os.open(
                path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, _PRIVATE_FILE
            ), path
        except FileExistsError:
            continue
    raise StoreError(f"no free temporary name in {folder}")


def _unlink(path: Path) -> None:
    try:
        os.unlink(path)
    except OSError as exc:
        if exc.errno != errno.ENOENT:
            raise


def new_file_id() -> str:
    """An opaque, unguessable id (24 characters of ``secrets.token_urlsafe``) that never
    begins with ``-``: people pass it on command lines (``files rm CHAT ID``), where that
    would read as an option."""
    while (file_id := secrets.token_urlsafe(18)).startswith("-"):
        pass
    return file_id
