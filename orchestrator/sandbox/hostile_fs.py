"""Touching folders an agent can write: everything there is hostile.

A group's workspace is the agent's
to shape while its container runs, and a background process may go on
shaping it while the host looks: any entry can become a symlink, a FIFO, a
socket or a huge file between two system calls.  A path checked and then
used by name is a race the agent can win (``realpath`` says "inside",
``open`` then follows the symlink that replaced the file).

So the host never uses a path below such a folder by name.  It opens the
folder once, then walks one component at a time relative to the directory
descriptor it holds (``openat``-style, ``dir_fd=``), with ``O_NOFOLLOW`` on
every step: a symlink anywhere is refused, never followed; ``..`` is
refused.  A file is opened non-blocking (a FIFO cannot hang the worker) and
accepted only if ``fstat`` of the open descriptor says it is a regular file;
reads are bounded.  Ownership changes go through the same descriptors with
``follow_symlinks=False``; a socket there is connected to through a
descriptor of the entry itself (``connect_unix``).

A walk over a whole folder (``chown_tree``) is bounded too: a folder can hold
millions of names at no inode cost (hard links), so no folder is ever listed
whole; it is read as it is walked, one open listing per level, and the walk
stops with an error past :data:`MAX_WALK_ENTRIES` entries or
:data:`MAX_WALK_DEPTH` levels (which bounds its descriptors).

Every function raises :class:`~orchestrator.core.errors.HostileEntry` (naming
the path and why) for what it refuses.
"""

from __future__ import annotations

import errno
import os
import shutil
import socket
import stat
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from orchestrator.core.errors import HostileEntry

_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
_FILE_FLAGS = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_NOCTTY | os.O_CLOEXEC
# A path deeper than this is refused rather than walked.
MAX_DEPTH = 64
# The bounds of a walk over a whole folder (chown_tree), as the quota's measure
# (sandbox/quota/usage.py: MAX_ENTRIES, MAX_DEPTH) has them: what it cannot measure is
# not handed over either.  Names cost folder space, not inodes (a hard link is a
# name), so the entries are capped, not the files; the depth bounds the
# descriptors a walk holds (two a level: the folder's and its listing's).
MAX_WALK_ENTRIES = 1_000_000
MAX_WALK_DEPTH = 128
_OUT_OF_RESOURCES = frozenset({errno.EMFILE, errno.ENFILE, errno.ENOMEM})


def _components(relative: str) -> list[str]:
    if not relative or os.path.isabs(relative):
        raise HostileEntry(relative, "not a relative path inside the folder")
    parts = [p for p in relative.split("/") if p not in ("", ".")]
    if not parts:
        raise HostileEntry(relative, "names the folder itself, not a file in it")
    if ".." in parts:
        raise HostileEntry(relative, "'..' is not allowed")
    if len(parts) > MAX_DEPTH:
        raise HostileEntry(relative, f"more than {MAX_DEPTH} levels deep")
    return parts


def _why(exc: OSError) -> str:
    if exc.errno == errno.ELOOP:
        return "a symlink (never followed)"
    if exc.errno == errno.ENOTDIR:
        return "a path component is not a folder (or is a symlink)"
    if exc.errno == errno.ENOENT:
        return "no such file"
    if exc.errno == errno.ENXIO:
        return "a socket or device, not a regular file"
    return exc.strerror or str(exc)


def open_root(folder: Path) -> int:
    """A descriptor of ``folder`` itself (host-made; still never a symlink)."""
    try:
        return os.open(folder, _DIR_FLAGS)
    except OSError as exc:
        raise HostileEntry(str(folder), _why(exc)) from None


@contextmanager
def opened_root(folder: Path) -> Iterator[int]:
    fd = open_root(folder)
    try:
        yield fd
    finally:
        os.close(fd)


def _open_dirs(root_fd: int, parts: list[str], relative: str, *, create: bool = False) -> int:
    """Walk ``parts`` (folders) from ``root_fd``; returns a new descriptor of the last one."""
    fd = os.dup(root_fd)
    try:
        for part in parts:
            if create:
                try:
                    os.mkdir(part, 0o755, dir_fd=fd)
                except FileExistsError:
                    pass  # whatever is there is checked by the open below
            nxt = os.open(part, _DIR_FLAGS, dir_fd=fd)
            os.close(fd)
            fd = nxt
        return fd
    except OSError as exc:
        os.close(fd)
        raise HostileEntry(relative, _why(exc)) from None


def open_regular(root_fd: int, relative: str) -> int:
    """Open ``relative`` below ``root_fd`` for reading: a regular file, reached
    without following any symlink, or :class:`HostileEntry`."""
    parts = _components(relative)
    parent = _open_dirs(root_fd, parts[:-1], relative)
    try:
        fd = os.open(parts[-1], _FILE_FLAGS, dir_fd=parent)
    except IsADirectoryError:
        raise HostileEntry(relative, "is a directory") from None
    except OSError as exc:
        raise HostileEntry(relative, _why(exc)) from None
    finally:
        os.close(parent)
    st = os.fstat(fd)
    if not stat.S_ISREG(st.st_mode):
        os.close(fd)
        kind = "a directory" if stat.S_ISDIR(st.st_mode) else "not a regular file (FIFO, socket or device)"
        raise HostileEntry(relative, f"is {kind}")
    return fd


def read_regular(folder: Path, relative: str, limit: int) -> tuple[bytes, os.stat_result]:
    """At most ``limit + 1`` bytes of a regular file below ``folder`` (so the
    caller can tell it was cut), and its ``fstat``."""
    with opened_root(folder) as root:
        fd = open_regular(root, relative)
    try:
        st = os.fstat(fd)
        chunks: list[bytes] = []
        want = limit + 1
        while want > 0:
            chunk = os.read(fd, min(want, 1 << 20))
            if not chunk:
                break
            chunks.append(chunk)
            want -= len(chunk)
        return b"".join(chunks), st
    finally:
        os.close(fd)


def connect_unix(folder: Path, relative: str) -> socket.socket:
    """Connect to the unix socket at ``relative`` below ``folder``.

    ``connect()`` takes a path and would follow a symlink planted there (to
    any socket of the host).  So the entry is opened with ``O_PATH |
    O_NOFOLLOW`` (a descriptor of the entry itself, whatever it is), checked
    with ``fstat`` to be a socket, and connected to through its
    ``/proc/self/fd`` entry, which names that very inode.  Raises
    :class:`HostileEntry` for anything but a socket, ``OSError`` when nothing
    listens on it.
    """
    return connect_unix_named(folder, relative)[0]


# Which socket a connection reached: the entry's device, inode and inode change time (ns).
# A bind makes a new inode, and an inode number freed and given again has a new change
# time: two binds, even at the same path, never share it.
SocketIdentity = tuple[int, int, int]


def connect_unix_named(
    folder: Path, relative: str, *, expect: SocketIdentity | None = None
) -> tuple[socket.socket, SocketIdentity]:
    """:func:`connect_unix`, and which socket it reached (:data:`SocketIdentity`, read
    from the very descriptor it connects through, so no other entry can stand in
    between the check and the connection).  With ``expect``: only that one, else
    :class:`HostileEntry` (and no connection is made)."""
    parts = _components(relative)
    with opened_root(folder) as root:
        parent = _open_dirs(root, parts[:-1], relative)
        try:
            fd = os.open(parts[-1], os.O_PATH | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=parent)
        except OSError as exc:
            raise HostileEntry(relative, _why(exc)) from None
        finally:
            os.close(parent)
    try:
        st = os.fstat(fd)
        if not stat.S_ISSOCK(st.st_mode):
            raise HostileEntry(relative, "not a socket (a symlink or a file in its place)")
        if expect is not None and (st.st_dev, st.st_ino, st.st_ctime_ns) != expect:
            raise HostileEntry(relative, "another socket than the one expected")
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            sock.connect(f"/proc/self/fd/{fd}")
        except OSError:
            sock.close()
            raise
        # Read again once it listens: a listener may still change its socket's mode
        # between its bind and its listen (the runner does), which moves the change time.
        st = os.fstat(fd)
        return sock, (st.st_dev, st.st_ino, st.st_ctime_ns)
    finally:
        os.close(fd)


def remove_entry(folder: Path, relative: str) -> None:
    """Remove whatever is at ``relative`` below ``folder`` (a folder with all it
    holds), reached with no symlink followed; ``unlink`` and ``rmtree`` by
    descriptor never follow one either.  Nothing there is fine."""
    parts = _components(relative)
    with opened_root(folder) as root:
        try:
            parent = _open_dirs(root, parts[:-1], relative)
        except HostileEntry as exc:
            if exc.reason == "no such file":
                return
            raise
        try:
            st = os.stat(parts[-1], dir_fd=parent, follow_symlinks=False)
            if stat.S_ISDIR(st.st_mode):
                shutil.rmtree(parts[-1], dir_fd=parent)
            else:
                os.unlink(parts[-1], dir_fd=parent)
        except FileNotFoundError:
            pass
        except OSError as exc:
            raise HostileEntry(relative, _why(exc)) from None
        finally:
            os.close(parent)


def make_dirs(folder: Path, relative: str) -> None:
    """Create the folders of ``relative`` below ``folder`` (as plain folders we
    reached without following a symlink), or raise :class:`HostileEntry`."""
    parts = _components(relative)
    with opened_root(folder) as root:
        os.close(_open_dirs(root, parts, relative, create=True))


def chown_tree(  # noqa: C901 - a descriptor walk: each entry kind handled where it is met
    folder: Path, uid: int, gid: int, *, max_entries: int | None = None, max_depth: int | None = None
) -> int:
    """lchown ``folder`` and everything below it to ``uid:gid``, touching only
    entries that are not theirs yet (a chown to the same owner still writes the
    inode).  Walks by descriptor: a folder swapped for a symlink mid-walk is
    skipped, never followed.  Returns how many entries changed owner.

    Bounded (see :data:`MAX_WALK_ENTRIES`, :data:`MAX_WALK_DEPTH`): each folder is
    read lazily, depth first, with one descriptor and one listing open per level,
    so memory and descriptors stay flat however many names a folder holds.  Past
    ``max_entries`` entries or ``max_depth`` levels it raises :class:`HostileEntry`
    (naming the bound): a workspace the host cannot hand over whole fails the run
    (the entry cap also ends a walk a live container keeps feeding new names).
    Out of descriptors or memory it raises that ``OSError`` rather than skip on."""
    max_entries = MAX_WALK_ENTRIES if max_entries is None else max_entries
    max_depth = MAX_WALK_DEPTH if max_depth is None else max_depth
    changed = 0
    seen = 0
    try:
        root = open_root(folder)
    except HostileEntry:
        return 0
    try:
        st = os.fstat(root)
        if (st.st_uid, st.st_gid) != (uid, gid):
            os.fchown(root, uid, gid)
            changed += 1
    except BaseException:
        os.close(root)
        raise
    try:
        listing = os.scandir(root)
    except OSError:
        os.close(root)
        return changed
    # (descriptor, its listing) of each folder on the way down: a folder is read
    # as it is walked, never listed whole; popped (and closed) when read out.
    frames: list[tuple[int, Iterator[os.DirEntry[str]]]] = [(root, listing)]
    try:
        while frames:
            fd, entries = frames[-1]
            try:
                entry = next(entries, None)
            except OSError:
                entry = None  # the folder went unreadable mid-listing: as one that could not be opened
            if entry is None:
                frames.pop()
                _close_frame(fd, entries)
                continue
            seen += 1
            if seen > max_entries:
                raise HostileEntry(
                    str(folder),
                    f"holds more than {max_entries} entries "
                    "(hostile_fs.MAX_WALK_ENTRIES); not handed to the container's user",
                )
            try:
                est = entry.stat(follow_symlinks=False)
                if (est.st_uid, est.st_gid) != (uid, gid):
                    os.chown(entry.name, uid, gid, dir_fd=fd, follow_symlinks=False)
                    changed += 1
                if not stat.S_ISDIR(est.st_mode):
                    continue
            except OSError:
                continue  # gone or swapped since the listing
            if len(frames) > max_depth:  # this folder would be level len(frames)
                raise HostileEntry(
                    str(folder),
                    f"folders nested deeper than {max_depth} levels "
                    "(hostile_fs.MAX_WALK_DEPTH); not handed to the container's user",
                )
            try:
                # O_NOFOLLOW: if it became a symlink since the stat, this fails.
                sub = os.open(entry.name, _DIR_FLAGS, dir_fd=fd)
            except OSError as exc:
                if exc.errno in _OUT_OF_RESOURCES:
                    raise  # the host's shortage: skipping on would hand over part of the folder
                continue
            try:
                frames.append((sub, os.scandir(sub)))
            except OSError as exc:
                os.close(sub)
                if exc.errno in _OUT_OF_RESOURCES:
                    raise
    finally:
        for fd, entries in reversed(frames):
            _close_frame(fd, entries)
    return changed


def _close_frame(fd: int, entries: Iterator[os.DirEntry[str]]) -> None:
    close = getattr(entries, "close", None)
    if close is not None:
        close()
    os.close(fd)
