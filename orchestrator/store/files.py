"""Files people send and agents hand back: stored once by content (:class:`FileStore`).

**Where the bytes live.**  Under ``<data_dir>/files`` (:attr:`Settings.files_dir`, this
user's alone like the rest of the data dir: folders 0700, files 0600), once per content,
at ``<sha256[:2]>/<sha256>``, so every host of a fleet that shares the data dir sees them.
An upload streams into a temporary file under ``tmp/`` in chunks (never whole in memory),
counted and hashed as it comes and stopped past ``ORCHESTRATOR_FILE_MAX_BYTES``; only a
complete file is renamed into place (a rename within one file system: no reader ever
sees part of one).  What is refused leaves neither bytes nor a row.

**The rows** (``files``, ``store/file_rows.py``) are one per reference: a chat storing a
file.  A group's files count against ``ORCHESTRATOR_GROUP_FILES_MAX_BYTES`` by the contents
it stored first (each once): storing what another chat stored before costs nothing more.
The check and the insert run under the database's write lock (SQLite's ``BEGIN
IMMEDIATE``; PostgreSQL's transaction-scoped advisory lock 726935), so two uploads at once
cannot both take the last room.

**Freeing.**  A file no live message names is freed after a grace (:meth:`FileStore.prune`,
run by the sweeper): its row, and its bytes once no row is left.

The type is sniffed from the bytes (``store/file_types.py``), the name made safe
(``store/file_names.py``), and a message's references are checked against the rows
(``store/file_refs.py``).
"""

from __future__ import annotations

import errno
import hashlib
import os
import secrets
import stat
import time
from collections.abc import Callable, Iterable, Iterator
from datetime import timedelta
from pathlib import Path
from typing import Protocol

from orchestrator.core.errors import FileTooLarge, NotFound, StoreError
from orchestrator.core.private_dirs import private_dir
from orchestrator.core.settings import Settings
from orchestrator.store.db import Database, db_now, driver_execute
from orchestrator.store.file_names import safe_name
from orchestrator.store.file_rows import COLUMNS, StoredFile, db_value, group_bytes, new_file_id, stored_file
from orchestrator.store.file_types import Sniffer

CHUNK_BYTES = 1 << 20
_PRIVATE_FILE = 0o600
# PostgreSQL: one upload's check-and-insert at a time in the whole fleet (they are rare,
# and the bytes are on disk before the lock is taken).  SQLite: the write lock already is.
_PG_FILES_LOCK = "SELECT pg_advisory_xact_lock(726935)"
# A file no live message names: none, or only superseded or deleted ones (message_files
# rows outlive the messages an unregistered chat's window deletes).
_UNREFERENCED = (
    "SELECT f.id, f.chat_jid, f.sha256, f.size, f.mime, f.name, f.owner_jid, f.created_at FROM files f "
    "WHERE f.created_at < :cutoff {chat} AND NOT EXISTS (SELECT 1 FROM message_files mf "
    "JOIN messages m ON m.chat_jid = mf.chat_jid AND m.id = mf.message_id "
    "WHERE mf.file_id = f.id AND m.superseded_at IS NULL) ORDER BY f.created_at, f.id LIMIT :limit"
)


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
            db,
            settings.files_dir,
            max_bytes=settings.files.max_bytes,
            group_max_bytes=settings.files.group_files_max_bytes,
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
            cutoff = db_value(conn, db_now(conn) - timedelta(seconds=grace_s))
            sql = _UNREFERENCED.format(chat="AND f.chat_jid = :chat_jid" if chat_jid is not None else "")
            params: dict[str, object] = {"cutoff": cutoff, "limit": limit}
            if chat_jid is not None:
                params["chat_jid"] = chat_jid
            return [stored_file(r) for r in driver_execute(conn, sql, params).fetchall()]

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
                    f"INSERT INTO files ({COLUMNS}) VALUES "
                    "(:id, :chat_jid, :sha256, :size, :mime, :name, :owner_jid, :created_at)",
                    {**row.__dict__, "created_at": db_value(conn, row.created_at)},
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
        sql = f"SELECT {COLUMNS} FROM files WHERE id = :id"
        params: dict[str, object] = {"id": file_id}
        if chat_jid is not None:
            sql += " AND chat_jid = :chat_jid"
            params["chat_jid"] = chat_jid
        rows = self.db.read_fixed(sql, params)
        if not rows:
            raise NotFound(f"no file {file_id!r}" + (f" in {chat_jid}" if chat_jid else ""))
        return stored_file(rows[0])

    def list_chat(self, chat_jid: str) -> list[StoredFile]:
        """The files ``chat_jid`` stored, oldest first."""
        rows = self.db.read_fixed(
            f"SELECT {COLUMNS} FROM files WHERE chat_jid = :chat_jid ORDER BY created_at, id", {"chat_jid": chat_jid}
        )
        return [stored_file(r) for r in rows]

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
