"""A run's files placed in the group's workspace, under ``inbox/``, before the run.

The workspace is the agent's (``hostile_fs``): anything may be at ``inbox`` or at any name
in it, put there by an earlier run or by a process still running in a warm container.  So
:func:`place_files` walks by descriptor: the workspace opened with ``O_NOFOLLOW``, ``inbox``
made if missing and opened with ``O_NOFOLLOW | O_DIRECTORY`` relative to it (a symlink, a
FIFO or a file there is refused with :class:`HostileEntry`, and nothing is placed), and each
file created relative to that descriptor with ``O_CREAT | O_EXCL | O_NOFOLLOW``, which never
follows a link and never opens what is there: a name taken by anything (a file, a symlink,
a FIFO) is left alone and the next name is tried, unless it is a regular file holding
exactly the file's bytes (an earlier attempt of the same run placed it): that one is reused.

**The naming scheme**: ``inbox/<name>``, where ``<name>`` is the sender's name made safe
(``store.file_names.safe_name``: no directories, no control characters, no leading dot, at most
120 bytes of UTF-8, never empty); when that is taken, ``<stem> (2)<ext>``, ``<stem>
(3)<ext>``, ... (``store.file_names.numbered_names``).  Nothing in the workspace is ever
replaced.

The bytes are copied from the file store through a descriptor whose ``fstat`` size is
checked against the stored size first (``FileStore.open_content``), and exactly that many
are copied: a content file that is not what was stored (a 2 GiB file in its place) is
refused before a byte is read.  The new files and an ``inbox`` made here are handed to the
container's user as the pipeline hands over the workspace (``containers.prepare_folder``:
uid 1000 when the host runs as root, else this user's own).  If any file cannot be placed,
the ones this call created are removed again: a run sees all its files or none.
"""

from __future__ import annotations

import errno
import hashlib
import os
import stat
from dataclasses import dataclass
from pathlib import Path

from orchestrator.core.errors import HostileEntry, StoreError
from orchestrator.sandbox.containers import CONTAINER_UID
from orchestrator.sandbox.hostile_fs import opened_root
from orchestrator.store.file_names import numbered_names, safe_name
from orchestrator.store.file_rows import StoredFile
from orchestrator.store.files import CHUNK_BYTES, FileStore

INBOX = "inbox"
_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
_READ_FLAGS = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_NOCTTY | os.O_CLOEXEC
_NEW_FILE_FLAGS = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC
_FILE_MODE = 0o644
_DIR_MODE = 0o755
# Names tried for one file before giving up (an inbox full of "name (n).ext").
MAX_NAME_TRIES = 1000


@dataclass(frozen=True)
class PlacedFile:
    """A stored file as the run finds it: ``path`` is relative to the workspace (``inbox/<name>``)."""

    file_id: str
    path: str
    name: str
    size: int
    mime: str


def workspace_owner() -> tuple[int, int]:
    """Who the workspace's files belong to, as ``containers.prepare_folder`` decides: the
    container's user when the host runs as root, else this user (who the container runs as)."""
    if os.geteuid() == 0:
        return CONTAINER_UID, CONTAINER_UID
    return os.getuid(), os.getgid()


def place_files(
    workspace: Path, files: list[StoredFile], store: FileStore, *, owner: tuple[int, int] | None = None
) -> list[PlacedFile]:
    """Copy ``files`` from ``store`` into ``workspace/inbox/`` (see the module's docstring);
    returns where each went, in order.  ``owner`` (uid, gid): who the new entries belong to
    (None: :func:`workspace_owner`).  Raises :class:`HostileEntry` when ``inbox`` is not a
    plain folder, :class:`~orchestrator.core.errors.StoreError` when a file's content is not
    what was stored; either way nothing is left placed."""
    if not files:
        return []
    uid, gid = owner if owner is not None else workspace_owner()
    sources: list[int] = []
    try:
        # Every source checked (and opened) before anything is created.
        for stored in files:
            sources.append(store.open_content(stored))
        with opened_root(workspace) as root:
            inbox = _open_inbox(root, uid, gid)
            created: list[str] = []
            try:
                placed = []
                for stored, source in zip(files, sources, strict=True):
                    name = _place(inbox, stored, source, uid, gid, created)
                    placed.append(PlacedFile(stored.id, f"{INBOX}/{name}", name, stored.size, stored.mime))
                return placed
            except BaseException:
                for name in created:
                    try:
                        os.unlink(name, dir_fd=inbox)
                    except OSError:
                        pass
                raise
            finally:
                os.close(inbox)
    finally:
        for fd in sources:
            os.close(fd)


def _open_inbox(root: int, uid: int, gid: int) -> int:
    made = False
    try:
        os.mkdir(INBOX, _DIR_MODE, dir_fd=root)
        made = True
    except FileExistsError:
        pass  # whatever is there is checked by the open below
    except OSError as exc:
        raise HostileEntry(INBOX, f"cannot be made ({exc.strerror})") from None
    try:
        fd = os.open(INBOX, _DIR_FLAGS, dir_fd=root)
    except OSError as exc:
        raise HostileEntry(INBOX, _inbox_refusal(root, exc)) from None
    try:
        if made:
            os.fchown(fd, uid, gid)
    except BaseException:
        os.close(fd)
        raise
    return fd


def _inbox_refusal(root: int, exc: OSError) -> str:
    try:
        st = os.stat(INBOX, dir_fd=root, follow_symlinks=False)
    except OSError:
        return f"cannot be opened ({exc.strerror}); no file placed"
    if stat.S_ISLNK(st.st_mode):
        return "is a symlink (never followed); no file placed"
    if not stat.S_ISDIR(st.st_mode):
        return "is not a folder (a file, FIFO, socket or device); no file placed"
    return f"cannot be opened ({exc.strerror}); no file placed"


def _place(inbox: int, stored: StoredFile, source: int, uid: int, gid: int, created: list[str]) -> str:
    for candidate in numbered_names(safe_name(stored.name), MAX_NAME_TRIES):
        try:
            fd = os.open(candidate, _NEW_FILE_FLAGS, _FILE_MODE, dir_fd=inbox)
        except FileExistsError:
            # Taken by anything at all (a symlink too: O_EXCL never follows one).  The same
            # bytes already there (an earlier attempt of this run placed them) are reused.
            if _holds(inbox, candidate, stored):
                return candidate
            continue
        except OSError as exc:
            if exc.errno == errno.ELOOP:
                continue
            raise HostileEntry(f"{INBOX}/{candidate}", f"cannot be created ({exc.strerror})") from None
        created.append(candidate)
        try:
            _copy(source, fd, stored)
            os.fchown(fd, uid, gid)
        finally:
            os.close(fd)
        return candidate
    raise HostileEntry(f"{INBOX}/{stored.name}", f"{MAX_NAME_TRIES} names taken; not placed")


def _holds(inbox: int, name: str, stored: StoredFile) -> bool:
    """Whether ``inbox/name`` is a regular file (reached without a link) with exactly
    ``stored``'s bytes: its size by ``fstat`` first, then its SHA-256, reading no more."""
    try:
        fd = os.open(name, _READ_FLAGS, dir_fd=inbox)
    except OSError:
        return False
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode) or st.st_size != stored.size:
            return False
        digest = hashlib.sha256()
        offset = 0
        while offset < stored.size:
            chunk = os.pread(fd, min(CHUNK_BYTES, stored.size - offset), offset)
            if not chunk:
                return False
            digest.update(chunk)
            offset += len(chunk)
        return digest.hexdigest() == stored.sha256
    finally:
        os.close(fd)


def _copy(source: int, target: int, stored: StoredFile) -> None:
    """Exactly ``stored.size`` bytes from ``source`` (read from its start) to ``target``."""
    left = stored.size
    offset = 0
    while left > 0:
        chunk = os.pread(source, min(left, CHUNK_BYTES), offset)
        if not chunk:
            raise StoreError(f"file {stored.id}: its content ended after {offset} of {stored.size} bytes")
        view = memoryview(chunk)
        while view:
            view = view[os.write(target, view) :]
        offset += len(chunk)
        left -= len(chunk)
