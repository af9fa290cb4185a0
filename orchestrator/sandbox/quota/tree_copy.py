"""A folder's files moved into its new volume: measured first, copied by descriptor, the folder emptied.

The folder a volume is mounted over would be hidden, its files never seen again: so what
it holds is copied into the volume (through a host-only mount point) before the volume
goes in place.  The folder is the agent's and hostile: every entry is opened relative to
its parent's descriptor with ``O_NOFOLLOW``, regular files only with ``O_NONBLOCK``,
symlinks copied as links (never followed), FIFOs, sockets and devices skipped; owners,
modes (no set-id bits) and times kept, holes kept in sparse files.
"""

from __future__ import annotations

import contextlib
import logging
import os
import shutil
import stat
from pathlib import Path

from orchestrator.core.errors import WorkspaceQuotaError
from orchestrator.core.sizes import human_size
from orchestrator.sandbox.quota.usage import MAX_DEPTH, OPEN_DIR, measure

log = logging.getLogger(__name__)


def move_content(src: int, dst: int, moved: list[bool], *, folder: str, workspace: Path) -> None:
    """Move the entries of directory ``src`` (the workspace ``workspace`` of ``folder``) into
    the volume's root ``dst``, both descriptors; ``moved`` gets an item once ``src`` is being
    emptied (the files are in the volume from then on)."""
    usage = measure(src)
    room = os.statvfs(dst)
    free = room.f_bavail * room.f_frsize
    if not usage.complete or usage.bytes > free:
        what = usage.why if not usage.complete else f"{human_size(usage.bytes)} do not fit in {human_size(free)}"
        raise WorkspaceQuotaError(
            f"workspace quota: the files of {folder!r} cannot move into its volume ({what}); "
            f"free space in {workspace} or raise the group's workspace_quota"
        )
    try:
        skipped = copy_tree(src, dst, 0)
    except OSError as exc:
        raise WorkspaceQuotaError(
            f"workspace quota: moving the files of {folder!r} into its volume failed: {exc}"
        ) from exc
    if skipped:
        log.warning("workspace %s: %d FIFO(s), socket(s) or device(s) not moved into its volume", workspace, skipped)
    # Everything is in the volume: empty the folder it will hide.
    moved.append(True)
    with os.scandir(src) as it:
        leftovers = list(it)
    for entry in leftovers:
        if entry.is_dir(follow_symlinks=False):
            shutil.rmtree(entry.name, dir_fd=src)
        else:
            os.unlink(entry.name, dir_fd=src)


def _set_meta(fd: int, st: os.stat_result, mode: int) -> None:
    """Owner, mode and times of a copied file or folder, by descriptor."""
    os.fchown(fd, st.st_uid, st.st_gid)
    os.fchmod(fd, mode)
    os.utime(fd, ns=(st.st_atime_ns, st.st_mtime_ns))


def copy_tree(src: int, dst: int, depth: int) -> int:
    """Copy the entries of directory ``src`` into ``dst`` (both descriptors), replacing what
    is there; nothing followed, ownership, modes (no set-id bits) and times kept.  Returns
    how many entries were skipped (FIFOs, sockets, devices)."""
    if depth > MAX_DEPTH:
        raise OSError(f"folders nested deeper than {MAX_DEPTH} levels")
    skipped = 0
    with os.scandir(src) as it:
        entries = list(it)
    for entry in entries:
        name = entry.name
        try:
            st = entry.stat(follow_symlinks=False)
        except FileNotFoundError:
            continue
        mode = stat.S_IMODE(st.st_mode) & 0o1777
        if stat.S_ISDIR(st.st_mode):
            _clear_unless(dst, name, stat.S_ISDIR)
            with contextlib.suppress(FileExistsError):
                os.mkdir(name, 0o700, dir_fd=dst)
            s = os.open(name, OPEN_DIR, dir_fd=src)
            try:
                d = os.open(name, OPEN_DIR, dir_fd=dst)
                try:
                    if (os.fstat(s).st_ino, os.fstat(s).st_dev) != (st.st_ino, st.st_dev):
                        raise OSError(f"{name!r} changed while it was copied")
                    skipped += copy_tree(s, d, depth + 1)
                    _set_meta(d, st, mode)
                finally:
                    os.close(d)
            finally:
                os.close(s)
        elif stat.S_ISREG(st.st_mode):
            _clear_unless(dst, name, None)
            s = os.open(name, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC, dir_fd=src)
            try:
                sst = os.fstat(s)
                if not stat.S_ISREG(sst.st_mode):
                    skipped += 1
                    continue
                d = os.open(
                    name, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600, dir_fd=dst
                )
                try:
                    _copy_bytes(s, d, sst.st_size)
                    _set_meta(d, st, mode)
                finally:
                    os.close(d)
            finally:
                os.close(s)
        elif stat.S_ISLNK(st.st_mode):
            _clear_unless(dst, name, None)
            target = os.readlink(name, dir_fd=src)
            os.symlink(target, name, dir_fd=dst)
            os.chown(name, st.st_uid, st.st_gid, dir_fd=dst, follow_symlinks=False)
            with contextlib.suppress(OSError, NotImplementedError):
                os.utime(name, ns=(st.st_atime_ns, st.st_mtime_ns), dir_fd=dst, follow_symlinks=False)
        else:
            skipped += 1
    return skipped


def _clear_unless(dst: int, name: str, keep: object) -> None:
    """Remove ``name`` from ``dst`` unless it is a directory and ``keep`` says directories stay."""
    try:
        st = os.stat(name, dir_fd=dst, follow_symlinks=False)
    except FileNotFoundError:
        return
    if stat.S_ISDIR(st.st_mode):
        if keep is stat.S_ISDIR:
            return
        shutil.rmtree(name, dir_fd=dst)
    else:
        os.unlink(name, dir_fd=dst)


def _copy_bytes(src: int, dst: int, size: int) -> None:
    """Copy a file's data, keeping holes (SEEK_DATA/SEEK_HOLE) so a sparse file stays sparse."""
    pos = 0
    while pos < size:
        try:
            data = os.lseek(src, pos, os.SEEK_DATA)
        except OSError:  # ENXIO: only a hole is left
            break
        hole = os.lseek(src, data, os.SEEK_HOLE)
        offset = data
        while offset < hole:
            chunk = os.pread(src, min(hole - offset, 1 << 20), offset)
            if not chunk:
                break
            offset += os.pwrite(dst, chunk, offset)
        pos = hole
    os.ftruncate(dst, size)
