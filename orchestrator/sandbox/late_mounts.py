"""Mounts made after a container started, seen inside it (standby sandboxes).

A standby container (``orchestrator/sandbox/standby.py``) is started before
it belongs to a group; the group's folders reach it later.  Docker binds a
host folder with ``rslave`` propagation when asked, and a mount made later
*on* that host folder propagates into the container, provided the host
folder sits in a shared mount (:func:`make_shared`: ``data/standby`` is bound
onto itself and marked shared once per boot).

The mounts are made with the kernel's mount API (Linux 5.12 or later), by
system call, not by running ``mount``: a few hundred microseconds instead of
5 ms, and a read-only bind is read-only from its first moment.
``open_tree(OPEN_TREE_CLONE)`` makes a detached copy of the source's mount,
``mount_setattr`` sets its flags while nothing can see it, and
``move_mount`` attaches it on the target, from where it propagates with
those flags.  (``mount --bind`` then ``remount,ro`` would leave the bind
writable for a moment, and a remount does not propagate.)

Every path handed here is the host's own (under ``data/``, made by the
host, never writable by a container), except the *contents* of a group's
workspace, which a bind never reads.
"""

from __future__ import annotations

import ctypes
import errno
import os
import re
from dataclasses import dataclass
from pathlib import Path

# System call numbers of the mount API: the same on every architecture (the
# "generic" table, from Linux 5.2 and 5.12).
SYS_OPEN_TREE = 428
SYS_MOVE_MOUNT = 429
SYS_MOUNT_SETATTR = 442

AT_FDCWD = -100
AT_SYMLINK_NOFOLLOW = 0x100
AT_EMPTY_PATH = 0x1000
OPEN_TREE_CLONE = 1
MOVE_MOUNT_F_EMPTY_PATH = 0x4
MOUNT_ATTR_RDONLY = 0x1
MOUNT_ATTR_NOSUID = 0x2
MOUNT_ATTR_NODEV = 0x4
MOUNT_ATTR_NOEXEC = 0x8

MS_NOSUID = 0x2
MS_NODEV = 0x4
MS_NOEXEC = 0x8
MS_BIND = 0x1000
MS_SHARED = 1 << 20
MNT_DETACH = 0x2
UMOUNT_NOFOLLOW = 0x8


class _MountAttr(ctypes.Structure):
    _fields_ = [
        ("attr_set", ctypes.c_uint64),
        ("attr_clr", ctypes.c_uint64),
        ("propagation", ctypes.c_uint64),
        ("userns_fd", ctypes.c_uint64),
    ]


_libc = ctypes.CDLL(None, use_errno=True)
_libc.syscall.restype = ctypes.c_long
_libc.mount.argtypes = [ctypes.c_char_p, ctypes.c_char_p, ctypes.c_char_p, ctypes.c_ulong, ctypes.c_char_p]
_libc.umount2.argtypes = [ctypes.c_char_p, ctypes.c_int]


def _check(result: int, what: str) -> int:
    if result < 0:
        err = ctypes.get_errno()
        raise OSError(err, f"{what}: {os.strerror(err)}")
    return result


def bind(source: Path, target: Path, *, read_only: bool = False) -> None:
    """Attach a copy of the mount at ``source`` on ``target`` (both directories),
    nosuid and nodev, and read-only from the start when ``read_only``.  A link
    at ``source`` itself is refused, not followed."""
    fd = _check(
        _libc.syscall(
            ctypes.c_long(SYS_OPEN_TREE),
            ctypes.c_int(AT_FDCWD),
            os.fsencode(source),
            ctypes.c_uint(OPEN_TREE_CLONE | os.O_CLOEXEC | AT_SYMLINK_NOFOLLOW),
        ),
        f"open_tree {source}",
    )
    try:
        attr = _MountAttr(MOUNT_ATTR_NOSUID | MOUNT_ATTR_NODEV | (MOUNT_ATTR_RDONLY if read_only else 0), 0, 0, 0)
        _check(
            _libc.syscall(
                ctypes.c_long(SYS_MOUNT_SETATTR),
                ctypes.c_int(fd),
                b"",
                ctypes.c_uint(AT_EMPTY_PATH),
                ctypes.byref(attr),
                ctypes.c_size_t(ctypes.sizeof(attr)),
            ),
            f"mount_setattr {source}",
        )
        _check(
            _libc.syscall(
                ctypes.c_long(SYS_MOVE_MOUNT),
                ctypes.c_int(fd),
                b"",
                ctypes.c_int(AT_FDCWD),
                os.fsencode(target),
                ctypes.c_uint(MOVE_MOUNT_F_EMPTY_PATH),
            ),
            f"move_mount {target}",
        )
    finally:
        os.close(fd)


def tmpfs(target: Path, *, size: str, uid: int, mode: int = 0o700) -> None:
    """A small tmpfs on ``target`` owned by ``uid``: the one place a standby
    runner writes (its socket), bounded, and on no disk."""
    options = f"size={size},mode={mode:o},uid={uid},gid={uid}".encode()
    _check(
        _libc.mount(b"tmpfs", os.fsencode(target), b"tmpfs", MS_NOSUID | MS_NODEV | MS_NOEXEC, options),
        f"tmpfs on {target}",
    )


@dataclass(frozen=True)
class MountEntry:
    mount_point: str
    fstype: str
    source: str


def _unescape(field: str) -> str:
    return re.sub(r"\\([0-7]{3})", lambda m: chr(int(m.group(1), 8)), field)


def mount_entries() -> list[MountEntry]:
    """This process's mounts (``/proc/self/mountinfo``), in mount order."""
    out: list[MountEntry] = []
    with open("/proc/self/mountinfo", encoding="utf-8", errors="surrogateescape") as fh:
        for line in fh:
            fields = line.split()
            try:
                sep = fields.index("-", 6)
                out.append(MountEntry(_unescape(fields[4]), fields[sep + 1], _unescape(fields[sep + 2])))
            except (ValueError, IndexError):
                continue
    return out


def is_mount_point(path: Path) -> bool:
    """Whether something is mounted on ``path`` in this process's namespace."""
    wanted = os.path.realpath(path)
    return any(e.mount_point == wanted for e in mount_entries())


def make_shared(path: Path) -> None:
    """Make ``path`` a shared mount (bound onto itself first if it is none), so
    mounts made below it propagate to the containers that bind its folders
    ``rslave``.  Idempotent."""
    raw = os.fsencode(path)
    if not is_mount_point(path):
        _check(_libc.mount(raw, raw, None, MS_BIND, None), f"bind {path} onto itself")
    _check(_libc.mount(None, raw, None, MS_SHARED, None), f"make {path} shared")


def detach(target: Path) -> bool:
    """Unmount ``target`` lazily (it goes when nothing uses it any more); False
    when nothing was mounted there."""
    result = _libc.umount2(os.fsencode(target), MNT_DETACH | UMOUNT_NOFOLLOW)
    if result < 0:
        err = ctypes.get_errno()
        if err in (errno.EINVAL, errno.ENOENT):
            return False
        raise OSError(err, f"umount {target}: {os.strerror(err)}")
    return True


def unavailable_reason(probe_dir: Path) -> str | None:
    """Why this process cannot make late mounts, or None if it can: it must be
    root (CAP_SYS_ADMIN) in the engine's mount namespace, on a kernel with the
    mount API.  Probed for real: a read-only bind of ``probe_dir/a`` on
    ``probe_dir/b``, undone."""
    if os.geteuid() != 0:
        return "this worker is not root (binding a folder needs CAP_SYS_ADMIN)"
    a, b = probe_dir / "probe-a", probe_dir / "probe-b"
    try:
        a.mkdir(parents=True, exist_ok=True)
        b.mkdir(exist_ok=True)
        bind(a, b, read_only=True)
        detach(b)
    except OSError as exc:
        return f"this worker cannot bind folders ({exc})"
    finally:
        for p in (b, a):
            try:
                p.rmdir()
            except OSError:
                pass
    return None
