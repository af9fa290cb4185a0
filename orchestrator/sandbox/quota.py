"""The workspace quota: how much disk one group's workspace may take.

Why this exists: the workspace ``<data>/groups/<folder>`` is the one host
folder a run container writes (bind-mounted read-write at ``/workspace``),
and it sits on the filesystem that also holds the SQLite database and the
embedded broker.  Without a limit, ``fallocate -l 500G x`` inside the
sandbox fills that filesystem and stops every group of the installation.

The quota is ``ORCHESTRATOR_WORKSPACE_QUOTA`` (a size such as ``2g``; ``0``:
no quota), or a group's ``workspace_quota`` in its ``container_config``.  It
is enforced in one of two modes, chosen once per process
(:func:`quota_mode`, ``ORCHESTRATOR_WORKSPACE_QUOTA_MODE``: ``auto``,
``volume`` or ``checked``) and logged when a worker starts:

* **volume** (the host runs as root, with loop devices and e2fsprogs): the
  workspace is an ext4 filesystem in an image file
  ``<data>/volumes/<folder>.img`` (sparse, its size the quota, root's and
  0600 in a 0700 folder no container ever sees), loop-mounted ``nosuid,
  nodev,discard`` at the workspace path before the container is created.  A
  full workspace is ``No space left on device`` inside the sandbox; the data
  dir's filesystem gives a group at most its quota (and gets it back as the
  agent deletes files: ``discard`` punches holes in the image).  Setting up
  is idempotent and safe across threads and worker processes (a file lock,
  then ``/proc/self/mountinfo`` says whether the image is mounted there
  already); what the workspace held before is moved into the new
  filesystem; a larger quota grows the image (online, or unmounted when the
  kernel refuses), a smaller one is not applied (ext4 is not shrunk under a
  live workspace).
* **checked** (anything else): before each run the workspace's disk usage is
  measured (allocated blocks, a bounded walk that follows no symlink and
  stops at :data:`MAX_ENTRIES` entries or :data:`MAX_DEPTH` levels); over
  the quota, the run fails at once, without retries, naming usage and
  quota.  This does not stop a run from filling the disk *while it runs*.

Everything inside a workspace is the agent's and hostile: the walk and the
move open entries relative to directory descriptors with ``O_NOFOLLOW``,
regular files only with ``O_NONBLOCK``, and skip FIFOs, sockets and devices.
A refusal is a :class:`~orchestrator.core.errors.WorkspaceQuotaError`.
"""

from __future__ import annotations

import contextlib
import fcntl
import functools
import logging
import os
import re
import shutil
import stat
import subprocess
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from orchestrator.core.errors import VolumeMountedElsewhere, WorkspaceQuotaError
from orchestrator.core.settings import Settings
from orchestrator.core.sizes import human_size, parse_quota
from orchestrator.sandbox import mmp
from orchestrator.sandbox.late_mounts import MountEntry, mount_entries

log = logging.getLogger(__name__)

QuotaMode = Literal["off", "volume", "checked"]

# The checked mode's walk (and the move into a new volume) stops here: an
# agent that makes more entries or deeper folders cannot make the host walk
# for long; its run is refused instead.
MAX_ENTRIES = 1_000_000
MAX_DEPTH = 128
MAX_LINKS_TRACKED = 100_000  # hard-linked files the walk remembers, to count each once
TOOLS = ("mkfs.ext4", "e2fsck", "resize2fs", "tune2fs", "losetup", "mount", "umount")
MOUNT_OPTIONS = "nosuid,nodev,discard"
COMMAND_TIMEOUT_S = 120.0
AUTO_QUOTA_BYTES = 2 * 1024**3

_OPEN_DIR = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
# Volumes that are not a group's workspace are named with a dot, which no group
# folder can hold (store/groups.py's slug): a replay's scratch copy, a session folder.
SCRATCH_PREFIX = "replay."
SESSION_PREFIX = "session."


def workspace_quota_bytes(settings: Settings) -> int:
    """The installation's workspace quota in bytes (0: none), ``auto`` resolved for this host."""
    if settings.workspace_quota == "auto":
        return default_quota(settings)
    return parse_quota(settings.workspace_quota)


def default_quota(settings: Settings) -> int:
    """``ORCHESTRATOR_WORKSPACE_QUOTA=auto``: :data:`AUTO_QUOTA_BYTES` where a
    volume enforces it (nothing can outgrow it, even mid-run), none where only
    the checked mode could (its walk would cost every run of every group)."""
    if settings.workspace_quota_mode == "checked":
        return 0
    mode, _ = quota_mode(settings, AUTO_QUOTA_BYTES)
    return AUTO_QUOTA_BYTES if mode == "volume" else 0


# -- the mode ---------------------------------------------------------------------

_modes: dict[str, tuple[QuotaMode, str]] = {}
# data dir -> (when, why) making a volume last failed in this process; checked mode for a while
_volume_broken: dict[str, tuple[float, str]] = {}
RETRY_VOLUMES_S = 300.0


def quota_mode(settings: Settings, quota: int | None = None) -> tuple[QuotaMode, str]:
    """How a quota is enforced in this process, and why (cached per process)."""
    if quota is None:
        quota = workspace_quota_bytes(settings)
    if quota == 0:
        if settings.workspace_quota == "auto":
            return "off", "ORCHESTRATOR_WORKSPACE_QUOTA=auto, and this host cannot loop-mount volumes"
        return "off", "no workspace quota (ORCHESTRATOR_WORKSPACE_QUOTA=0)"
    wanted = settings.workspace_quota_mode
    if wanted == "checked":
        return "checked", "ORCHESTRATOR_WORKSPACE_QUOTA_MODE=checked"
    key = wanted
    if key not in _modes:
        _modes[key] = _detect(wanted)
    mode, why = _modes[key]
    broken = _volume_broken.get(str(settings.data_dir))
    if mode == "volume" and broken and wanted == "auto":
        if time.monotonic() - broken[0] < RETRY_VOLUMES_S:
            return "checked", f"making a volume failed in this process ({broken[1]})"
        del _volume_broken[str(settings.data_dir)]
    return mode, why


def _detect(wanted: str) -> tuple[QuotaMode, str]:
    problem = volume_problem()
    if problem is None:
        return "volume", "loop-mounted ext4 volumes (the host runs as root with loop devices)"
    if wanted == "volume":
        # Forced: every run with a quota is refused, saying why, rather than run unbounded.
        return "volume", f"ORCHESTRATOR_WORKSPACE_QUOTA_MODE=volume, but {problem}"
    return "checked", f"a usage check before each run ({problem})"


def volume_problem() -> str | None:
    """Why this process cannot loop-mount workspace volumes, or None if it can."""
    if os.geteuid() != 0:
        return "the host does not run as root"
    return _missing_tools()


@functools.cache
def _missing_tools() -> str | None:
    # Asked before every attempt (sandbox/fencing.py) and every heartbeat beat: the six
    # PATH searches were most of its cost, and a host's tools do not change under it.
    missing = [t for t in TOOLS if shutil.which(t) is None]
    if missing:
        return f"missing {', '.join(missing)} (apt-get install e2fsprogs mount)"
    if not os.path.exists("/dev/loop-control"):
        return "no loop devices (/dev/loop-control is missing)"
    return None


def describe_mode(settings: Settings) -> str:
    """One line for the worker's log at start."""
    mode, why = quota_mode(settings)
    if mode == "off":
        return (
            f"workspace quota: off ({why}): an agent can fill the disk that holds the database and "
            "the broker; set ORCHESTRATOR_WORKSPACE_QUOTA (e.g. 2g)"
        )
    size = human_size(workspace_quota_bytes(settings))
    if mode == "volume":
        return f"workspace quota: {size} per group, {why}"
    return (
        f"workspace quota: {size} per group, {why}; a run can still fill the disk while it runs "
        "(run the worker as root with loop devices for a hard limit)"
    )


# -- the hook ---------------------------------------------------------------------


def prepare_workspace(
    settings: Settings,
    folder: str,
    workspace: Path,
    quota: int,
    *,
    chat_jid: str = "",
    volume: Volume | None = None,
    what: str = "workspace",
    fix: str | None = None,
) -> None:
    """Put ``workspace`` under its quota before a run container is created.

    Volume mode: the group's volume is made, mounted or grown as needed.
    Checked mode: the usage is measured and a workspace over its quota is
    refused.  Raises :class:`WorkspaceQuotaError` (the run fails at once).

    Another agent-writable folder of the group (its session folder) is bounded
    the same way with its own ``volume``; ``what`` and ``fix`` word the refusals.
    """
    vol = volume or Volume.of(settings, folder, workspace)
    if quota == 0 and not vol.image.exists():
        return  # the default: no quota, no volume (one stat per run)
    top = vol.mounted()
    if top == "ours":
        if quota > vol.size() and quota_mode(settings, quota)[0] == "volume":
            _ensure_existing(vol, quota)
        return
    mode, why = quota_mode(settings, quota)
    if top == "foreign":
        # An operator's own filesystem (XFS project quota, a separate disk):
        # left as it is; the checked limit still applies.
        if quota:
            check_usage(workspace, quota, folder=folder, chat_jid=chat_jid, what=what, fix=fix)
        return
    if vol.image.exists():
        # The group's files live in its volume: never run on the empty folder under it.
        if volume_problem() is not None:
            raise WorkspaceQuotaError(
                f"the {what} of {folder!r} lives in the volume {vol.image}, which this worker cannot mount "
                f"({volume_problem()}); run the worker as root"
            )
        _ensure_existing(vol, quota)
        return
    if mode == "off":
        return
    if mode == "volume":
        if volume_problem() is not None:  # forced by the setting, impossible here
            raise WorkspaceQuotaError(f"the {what} quota of {folder!r} cannot be enforced: {why}")
        try:
            vol.ensure(quota)
            return
        except VolumeUnavailable as exc:
            if settings.workspace_quota_mode == "volume":
                raise WorkspaceQuotaError(f"cannot set up the {what} volume of {folder!r}: {exc}") from exc
            _volume_broken[str(settings.data_dir)] = (time.monotonic(), str(exc))
            log.warning(
                "cannot make workspace volumes (%s); checking usage before each run instead (trying again in %.0fs)",
                exc,
                RETRY_VOLUMES_S,
            )
    check_usage(workspace, quota, folder=folder, chat_jid=chat_jid, what=what, fix=fix)


def _ensure_existing(vol: Volume, quota: int) -> None:
    try:
        vol.ensure(quota)
    except VolumeUnavailable as exc:
        # The group's files are in the image: no falling back to the folder under it.
        raise WorkspaceQuotaError(f"cannot mount the workspace volume {vol.image} of {vol.folder!r}: {exc}") from exc


# -- the checked mode -------------------------------------------------------------


@dataclass(frozen=True)
class Usage:
    """What a workspace takes on disk."""

    bytes: int
    entries: int
    complete: bool = True
    why: str = ""  # when not complete: where the walk stopped


def measure(path: Path | int, *, max_entries: int = MAX_ENTRIES, max_depth: int = MAX_DEPTH) -> Usage:
    """Allocated bytes (``st_blocks``) under ``path``: no symlink followed, no other filesystem
    entered, every inode counted once, stopped at ``max_entries`` entries or ``max_depth`` levels.

    Depth first, one open descriptor per level: each folder is opened relative to
    its parent's descriptor with ``O_NOFOLLOW``, so a folder swapped for a
    symlink meanwhile is skipped, never followed.  ``path`` may be a directory descriptor."""
    try:
        root = os.open(".", _OPEN_DIR, dir_fd=path) if isinstance(path, int) else os.open(path, _OPEN_DIR)
    except FileNotFoundError:
        return Usage(0, 0)
    seen: set[int] = set()
    root_st = os.fstat(root)
    total = root_st.st_blocks * 512
    entries = 0

    def scan(fd: int) -> list[str]:
        nonlocal total, entries
        subdirs: list[str] = []
        try:
            it = os.scandir(fd)
        except OSError:
            return subdirs  # unreadable: counted as the entry it is
        with it:
            for entry in it:
                entries += 1
                if entries > max_entries:
                    raise _WalkStopped(f"more than {max_entries} entries")
                try:
                    st = entry.stat(follow_symlinks=False)
                except OSError:
                    continue  # gone meanwhile
                if st.st_nlink > 1 and not stat.S_ISDIR(st.st_mode):
                    key = (st.st_dev << 64) | st.st_ino
                    if key in seen:
                        continue
                    if len(seen) < MAX_LINKS_TRACKED:  # past it, links count again: more, never less
                        seen.add(key)
                total += st.st_blocks * 512
                if stat.S_ISDIR(st.st_mode) and st.st_dev == root_st.st_dev:
                    subdirs.append(entry.name)
        return subdirs

    frames: list[tuple[int, Iterator[str], int]] = []
    try:
        # A descriptor goes on the stack before its folder is read, so it is closed whatever happens.
        frames.append((root, iter(()), 0))
        frames[-1] = (root, iter(scan(root)), 0)
        while frames:
            fd, names, depth = frames[-1]
            name = next(names, None)
            if name is None:
                frames.pop()
                os.close(fd)
                continue
            if depth + 1 > max_depth:
                raise _WalkStopped(f"folders nested deeper than {max_depth} levels")
            try:
                sub = os.open(name, _OPEN_DIR, dir_fd=fd)
            except OSError:
                continue  # replaced by a symlink or removed meanwhile
            frames.append((sub, iter(()), depth + 1))
            frames[-1] = (sub, iter(scan(sub)), depth + 1)
    except _WalkStopped as stop:
        return Usage(total, entries, False, str(stop))
    finally:
        for fd, _, _ in frames:
            with contextlib.suppress(OSError):
                os.close(fd)
    return Usage(total, entries)


class _WalkStopped(Exception):
    pass


def check_usage(
    workspace: Path,
    quota: int,
    *,
    folder: str = "",
    chat_jid: str = "",
    max_entries: int = MAX_ENTRIES,
    max_depth: int = MAX_DEPTH,
    what: str = "workspace",
    fix: str | None = None,
) -> Usage:
    """Refuse a workspace (or the group's other folder ``what``) over ``quota``, or too large
    to measure; returns its usage."""
    started = time.monotonic()
    usage = measure(workspace, max_entries=max_entries, max_depth=max_depth)
    log.debug(
        "workspace %s: %s in %d entries, measured in %.3fs",
        workspace,
        human_size(usage.bytes),
        usage.entries,
        time.monotonic() - started,
    )
    name = folder or workspace.name
    fix = fix or (
        f"free space in {workspace} on the host, or raise the group's workspace_quota "
        f'(orchestrator groups set {chat_jid or "JID"} --container-config \'{{"workspace_quota": "..."}}\')'
    )
    if not usage.complete:
        raise WorkspaceQuotaError(
            f"{what} quota: the {what} of {name!r} cannot be measured ({usage.why}; "
            f"{human_size(usage.bytes)} counted so far, quota {human_size(quota)}); the run was not started: {fix}"
        )
    if usage.bytes > quota:
        raise WorkspaceQuotaError(
            f"{what} quota exceeded: the {what} of {name!r} uses {human_size(usage.bytes)} of its "
            f"{human_size(quota)} quota; the run was not started: {fix}"
        )
    return usage


# -- the volume mode --------------------------------------------------------------


class VolumeUnavailable(Exception):
    """A new volume could not be made or mounted (the caller may fall back to checking)."""


def volumes_dir(settings: Settings) -> Path:
    """Host-only: the images of the workspace volumes (never mounted into a container)."""
    return settings.data_dir / "volumes"


def _top_mount(path: str) -> MountEntry | None:
    hits = [e for e in mount_entries() if e.mount_point == path]
    return hits[-1] if hits else None


def loop_backing_file(device: str) -> str | None:
    """The file behind ``/dev/loopN`` (None for anything else)."""
    name = os.path.basename(device)
    if not re.fullmatch(r"loop[0-9]+", name):
        return None
    try:
        return Path(f"/sys/block/{name}/loop/backing_file").read_text(encoding="utf-8").rstrip("\n")
    except OSError:
        return None


def loop_devices_of(image: Path) -> list[str]:
    """Loop devices whose backing file is ``image`` (``/sys/block``, no program run)."""
    out = []
    with contextlib.suppress(OSError):
        for dev in sorted(os.listdir("/sys/block")):
            if dev.startswith("loop") and loop_backing_file(dev) == str(image):
                out.append(f"/dev/{dev}")
    return out


def _still_attached(image: Path, wait_s: float = 3.0) -> list[str]:
    """Loop devices still on ``image`` after its last unmount; the kernel detaches an
    autoclear device a moment later, so wait a little before calling it held."""
    deadline = time.monotonic() + wait_s
    while True:
        devices = loop_devices_of(image)
        if not devices or time.monotonic() > deadline:
            return devices
        time.sleep(0.02)


def _run(argv: list[str], ok: tuple[int, ...] = (0,)) -> str:
    try:
        res = subprocess.run(argv, capture_output=True, text=True, timeout=COMMAND_TIMEOUT_S, check=False)
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise VolumeUnavailable(f"{argv[0]}: {exc}") from exc
    if res.returncode not in ok:
        detail = (res.stderr or res.stdout).strip().splitlines()
        raise VolumeUnavailable(f"{' '.join(argv[:2])} failed ({res.returncode}): {detail[-1] if detail else ''}")
    return res.stdout


_thread_locks: dict[str, threading.Lock] = {}
_thread_locks_guard = threading.Lock()


@contextlib.contextmanager
def _locked(path: Path) -> Iterator[None]:
    """One holder at a time for a group's volume: threads of this process and other processes."""
    with _thread_locks_guard:
        tlock = _thread_locks.setdefault(str(path), threading.Lock())
    with tlock:
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
            yield
        finally:
            os.close(fd)  # releases the flock


@dataclass(frozen=True)
class Volume:
    """A group's workspace volume: its image, its lock, and where it is mounted.

    ``folder`` names the image; ``group`` is the group whose warm container holds
    the mount point (the folder itself unless the volume is another of the
    group's: its session folder's, ``session.<folder>``)."""

    settings: Settings
    folder: str
    workspace: Path  # where it is mounted (the group's workspace)
    group: str = ""

    @classmethod
    def of(cls, settings: Settings, folder: str, workspace: Path | None = None, *, group: str = "") -> Volume:
        return cls(settings, folder, Path(os.path.realpath(workspace or settings.groups_dir / folder)), group)

    @property
    def image(self) -> Path:
        # Resolved: the kernel names a loop device's backing file by its real path
        # (``<data>/volumes`` may be a symlink to, or a mount of, another disk).
        return Path(os.path.realpath(volumes_dir(self.settings))) / f"{self.folder}.img"

    @property
    def lock(self) -> Path:
        return volumes_dir(self.settings) / f"{self.folder}.lock"

    @property
    def staging(self) -> Path:
        # Where a volume is filled before it goes in place (host-only).
        return volumes_dir(self.settings) / f"{self.folder}.mnt"

    def size(self) -> int:
        try:
            return os.stat(self.image).st_size
        except FileNotFoundError:
            return 0

    def allocated(self) -> int:
        try:
            return os.stat(self.image).st_blocks * 512
        except FileNotFoundError:
            return 0

    def _is_ours(self, entry: MountEntry | None) -> bool:
        return entry is not None and loop_backing_file(entry.source) == str(self.image)

    def mounted(self, where: Path | None = None) -> Literal["ours", "foreign"] | None:
        """Is our image mounted at the workspace (or ``where``), something else, or nothing?"""
        entry = _top_mount(str(where or self.workspace))
        if entry is None:
            return None
        return "ours" if self._is_ours(entry) else "foreign"

    # -- making, mounting, growing -----------------------------------------

    def ensure(self, quota: int) -> None:
        """Make, fill, grow and mount the volume as needed (idempotent, under the group's lock)."""
        vdir = volumes_dir(self.settings)
        vdir.mkdir(mode=0o700, parents=True, exist_ok=True)
        os.chmod(vdir, 0o700)
        with _locked(self.lock):
            state = self.mounted()
            if state == "foreign":
                raise WorkspaceQuotaError(f"the workspace {self.workspace} is already a mount point of something else")
            if state == "ours":
                if quota > self.size():
                    self._grow(quota, mounted=True)
                return
            started = time.monotonic()
            fresh = not self.image.exists()
            if not fresh:
                self._protect()
            if fresh:
                self._make(quota)
            elif quota > self.size():
                self._grow(quota, mounted=False)
            elif quota and quota < self.size():
                log.warning(
                    "workspace volume %s is %s, above its quota %s: volumes are not shrunk",
                    self.image,
                    human_size(self.size()),
                    human_size(quota),
                )
            moved: list[bool] = []
            try:
                try:
                    self._put_in_place(fresh, moved)
                finally:
                    with contextlib.suppress(OSError):
                        self.staging.rmdir()  # empty once unmounted (EBUSY while mounted)
            except VolumeUnavailable as exc:
                if moved:
                    # The files are in the image now: never fall back to the emptied folder.
                    raise WorkspaceQuotaError(
                        f"the files of {self.folder!r} were moved into its volume {self.image}, "
                        f"but mounting it failed: {exc}"
                    ) from exc
                if fresh:
                    with contextlib.suppress(OSError):
                        self.image.unlink()
                raise
            except BaseException:
                if fresh and not moved:
                    with contextlib.suppress(OSError):
                        self.image.unlink()
                raise
            log.info(
                "workspace volume %s (%s) mounted at %s in %.3fs",
                self.image,
                human_size(self.size()),
                self.workspace,
                time.monotonic() - started,
            )

    def _make(self, quota: int) -> None:
        if quota <= 0:
            raise VolumeUnavailable("no quota to size a new volume with")
        free = shutil.disk_usage(self.image.parent).free
        if free < quota:
            log.warning(
                "the data dir's filesystem has %s free, less than the workspace quota %s of %s: "
                "a full workspace could still fill it",
                human_size(free),
                human_size(quota),
                self.folder,
            )
        tmp = self.image.with_name(self.image.name + ".new")
        with contextlib.suppress(FileNotFoundError):
            tmp.unlink()
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
        try:
            os.ftruncate(fd, quota)  # sparse: takes disk only as the agent writes
        finally:
            os.close(fd)
        try:
            # No journal (a scratch workspace; less to write), no reserved blocks, 4 KiB blocks.
            _run(
                [
                    "mkfs.ext4",
                    "-q",
                    "-F",
                    "-b",
                    "4096",
                    "-m",
                    "0",
                    "-O",
                    "^has_journal",
                    # Another machine's kernel may not mount it while this one has (sandbox/mmp.py).
                    *mmp.mkfs_options(),
                    "-L",
                    f"ws-{self.folder}"[:16],
                    str(tmp),
                ]
            )
        except BaseException:
            with contextlib.suppress(OSError):
                tmp.unlink()
            raise
        os.rename(tmp, self.image)

    def _protect(self) -> None:
        """Turn the multiple-mount protection on for an image made before it was used, while it
        is mounted nowhere on this machine (the hold says nowhere else either: this host's)."""
        if mmp.read_block(self.image) is not None or not self.image.exists() or loop_devices_of(self.image):
            return
        _run(mmp.enable_argv(self.image))
        log.info("workspace volume %s: multiple-mount protection turned on", self.image)

    def _mount(self, target: Path) -> None:
        # A loop device of its own, never one already on the image (what ``mount -o loop``
        # reuses): a second mount of the same device would share the first's filesystem and
        # skip the multiple-mount check that is the fence between machines (sandbox/mmp.py).
        device = _run(["losetup", "--find", "--show", str(self.image)]).strip()
        try:
            _run(["mount", "-t", "ext4", "-o", MOUNT_OPTIONS, device, str(target)])
        except VolumeUnavailable:
            with contextlib.suppress(VolumeUnavailable):
                _run(["losetup", "-d", device])
            block = mmp.read_block(self.image)
            if block is not None and block.in_use:
                # Refused by the multiple-mount protection: another kernel has it mounted.
                raise VolumeMountedElsewhere(self.folder, block.node) from None
            raise
        # Detached once unmounted (the kernel marks a busy device to clear itself), as
        # ``mount -o loop`` leaves it.
        with contextlib.suppress(VolumeUnavailable):
            _run(["losetup", "-d", device])
        if self.mounted(target) != "ours":
            raise VolumeUnavailable(f"mounted {self.image} at {target}, but /proc/self/mountinfo does not show it")

    def _umount(self, target: Path) -> None:
        _run(["umount", str(target)])

    def _put_in_place(self, fresh: bool, moved: list[bool]) -> None:
        """Mount the image at the workspace, moving what the folder holds into it first
        (``moved`` gets an item once the folder has been emptied into the image)."""
        # A warm container holds the folder as it is now: it must not keep writing there.
        _stop_warm(self.settings, self.group or self.folder)
        self.workspace.mkdir(parents=True, exist_ok=True)
        ws_fd = os.open(self.workspace, _OPEN_DIR)
        try:
            ws_st = os.fstat(ws_fd)
            with os.scandir(ws_fd) as it:
                has_content = any(True for _ in it)
            if has_content:
                # The folder under the mount would be hidden, never seen again: fill the
                # volume through a host-only mount point first, then empty the folder.
                self.staging.mkdir(mode=0o700, exist_ok=True)
                if self.mounted(self.staging) != "ours":
                    self._mount(self.staging)
                try:
                    dst = os.open(self.staging, _OPEN_DIR)
                    try:
                        with contextlib.suppress(OSError):
                            os.rmdir("lost+found", dir_fd=dst)
                        if fresh:
                            _settle_root(dst, ws_st)
                        self._move_content(ws_fd, dst, moved)
                    finally:
                        os.close(dst)
                finally:
                    self._umount(self.staging)
        finally:
            os.close(ws_fd)
        self._mount(self.workspace)
        dst = os.open(self.workspace, _OPEN_DIR)
        try:
            if fresh and not has_content:
                _settle_root(dst, ws_st)
            # mkfs and e2fsck make one; an empty one is dropped (the workspace is the agent's).
            with contextlib.suppress(OSError):
                os.rmdir("lost+found", dir_fd=dst)
        finally:
            os.close(dst)

    def _move_content(self, src: int, dst: int, moved: list[bool]) -> None:
        usage = measure(src)
        room = os.statvfs(dst)
        free = room.f_bavail * room.f_frsize
        if not usage.complete or usage.bytes > free:
            what = usage.why if not usage.complete else f"{human_size(usage.bytes)} do not fit in {human_size(free)}"
            raise WorkspaceQuotaError(
                f"workspace quota: the files of {self.folder!r} cannot move into its volume ({what}); "
                f"free space in {self.workspace} or raise the group's workspace_quota"
            )
        try:
            skipped = _copy_dir(src, dst, 0)
        except OSError as exc:
            raise WorkspaceQuotaError(
                f"workspace quota: moving the files of {self.folder!r} into its volume failed: {exc}"
            ) from exc
        if skipped:
            log.warning(
                "workspace %s: %d FIFO(s), socket(s) or device(s) not moved into its volume", self.workspace, skipped
            )
        # Everything is in the volume: empty the folder it will hide.
        moved.append(True)
        with os.scandir(src) as it:
            leftovers = list(it)
        for entry in leftovers:
            if entry.is_dir(follow_symlinks=False):
                shutil.rmtree(entry.name, dir_fd=src)
            else:
                os.unlink(entry.name, dir_fd=src)

    def _grow(self, quota: int, *, mounted: bool) -> None:
        """Grow the image and its filesystem to ``quota``.  Where that cannot be done now, the
        volume keeps its size (and the image its length, so the next run tries again)."""
        old = self.size()
        started = time.monotonic()
        if mounted:
            if self._grow_online(quota, old):
                return
            # Unmounted growth: no container may hold the filesystem meanwhile.
            _stop_warm(self.settings, self.group or self.folder)
            self._umount(self.workspace)
        try:
            if _still_attached(self.image):
                # Held in another mount namespace: never resize a live filesystem.
                log.warning(
                    "workspace volume %s is in use elsewhere; it stays at %s for now", self.image, human_size(old)
                )
                return
            try:
                # resize2fs wants a freshly checked filesystem; 1: e2fsck fixed something
                # (it recreates the lost+found that new volumes go without).
                _run(["e2fsck", "-f", "-p", str(self.image)], ok=(0, 1))
            except VolumeUnavailable as exc:
                log.warning("workspace volume %s stays at %s: %s", self.image, human_size(old), exc)
                return
            _set_length(self.image, quota)
            _run(["resize2fs", str(self.image)])
        finally:
            if mounted:
                self._mount(self.workspace)
                with contextlib.suppress(OSError):
                    os.rmdir(self.workspace / "lost+found")  # e2fsck's
        log.info(
            "workspace volume %s grown from %s to %s in %.3fs",
            self.image,
            human_size(old),
            human_size(quota),
            time.monotonic() - started,
        )

    def _grow_online(self, quota: int, old: int) -> bool:
        devices = loop_devices_of(self.image)
        if not devices:
            return False
        _set_length(self.image, quota)
        try:
            for dev in devices:
                _run(["losetup", "-c", dev])
            _run(["resize2fs", devices[0]])
        except VolumeUnavailable as exc:
            # Online growth needs CAP_SYS_RESOURCE.  The filesystem did not change: back to its length.
            log.info("growing %s online failed (%s); growing it unmounted", self.image, exc)
            _set_length(self.image, old)
            for dev in devices:
                with contextlib.suppress(VolumeUnavailable):
                    _run(["losetup", "-c", dev])
            return False
        log.info("workspace volume %s grown online from %s to %s", self.image, human_size(old), human_size(quota))
        return True

    def unmount(self) -> bool:
        """Unmount the volume from the workspace (and the staging point); the image stays."""
        with _locked(self.lock):
            done = False
            for where in (self.workspace, self.staging):
                while self.mounted(where) == "ours":
                    try:
                        self._umount(where)
                    except VolumeUnavailable:
                        _run(["umount", "-l", str(where)])
                    done = True
            return done


def _set_length(image: Path, length: int) -> None:
    fd = os.open(image, os.O_WRONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
    try:
        os.ftruncate(fd, length)
    finally:
        os.close(fd)


def _settle_root(fd: int, like: os.stat_result) -> None:
    """A new volume's root gets the folder's owner and mode."""
    os.fchown(fd, like.st_uid, like.st_gid)
    os.fchmod(fd, stat.S_IMODE(like.st_mode) & 0o1777)


def _stop_warm(settings: Settings, folder: str) -> None:
    if settings.warm_idle_s <= 0:
        return
    try:
        from orchestrator.sandbox.containers import docker_client
        from orchestrator.sandbox.warm import WarmPool

        WarmPool(settings, docker_client(settings)).stop(folder)
    except Exception as exc:  # noqa: BLE001 - no Docker: no warm container either
        log.warning("could not stop the warm container of %s: %s", folder, exc)


def _set_meta(fd: int, st: os.stat_result, mode: int) -> None:
    """Owner, mode and times of a copied file or folder, by descriptor."""
    os.fchown(fd, st.st_uid, st.st_gid)
    os.fchmod(fd, mode)
    os.utime(fd, ns=(st.st_atime_ns, st.st_mtime_ns))


def _copy_dir(src: int, dst: int, depth: int) -> int:
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
            s = os.open(name, _OPEN_DIR, dir_fd=src)
            try:
                d = os.open(name, _OPEN_DIR, dir_fd=dst)
                try:
                    if (os.fstat(s).st_ino, os.fstat(s).st_dev) != (st.st_ino, st.st_dev):
                        raise OSError(f"{name!r} changed while it was copied")
                    skipped += _copy_dir(s, d, depth + 1)
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


# -- reports and clean-up ---------------------------------------------------------


@dataclass(frozen=True)
class QuotaReport:
    folder: str
    mode: QuotaMode
    quota: int
    used: int
    volume: str | None  # the image, when the workspace has one
    mounted: bool
    size: int  # the volume's size (0 without one)
    allocated: int  # what the image takes on the data dir's filesystem
    note: str = ""


def report(settings: Settings, folder: str, quota: int) -> QuotaReport:
    """What a group's workspace takes, against its quota (for ``orchestrator groups quota``)."""
    vol = Volume.of(settings, folder)
    mode, why = quota_mode(settings, quota)
    state = vol.mounted()
    if state == "ours":
        st = os.statvfs(vol.workspace)
        used = (st.f_blocks - st.f_bfree) * st.f_frsize
        note = ""
    else:
        usage = measure(vol.workspace)
        used = usage.bytes
        note = "" if usage.complete else f"measured partly: {usage.why}"
    if vol.image.exists() and quota and quota < vol.size():
        note = (note + "; " if note else "") + f"the volume stays at {human_size(vol.size())}: volumes are not shrunk"
    if not note:
        note = why
    return QuotaReport(
        folder=folder,
        mode=mode,
        quota=quota,
        used=used,
        volume=str(vol.image) if vol.image.exists() else None,
        mounted=state == "ours",
        size=vol.size(),
        allocated=vol.allocated(),
        note=note,
    )


def group_volumes(settings: Settings, folder: str) -> list[Volume]:
    """The volumes a group has (its workspace's, its session folder's), mounted or not."""
    return [
        Volume.of(settings, folder),
        Volume.of(settings, SESSION_PREFIX + folder, settings.sessions_dir / folder, group=folder),
    ]


def _volume_named(settings: Settings, name: str) -> Volume | None:
    """The group volume an image's name stands for (None: a replay's scratch volume)."""
    if name.startswith(SCRATCH_PREFIX):
        return None
    if name.startswith(SESSION_PREFIX):
        return group_volumes(settings, name[len(SESSION_PREFIX) :])[1]
    return Volume.of(settings, name)


def mount_existing(settings: Settings, folder: str) -> None:
    """Mount the group's volumes that exist and are not mounted on this machine, as they are
    (no growth: the run's preparation does that): what a host does once it holds them, before
    its run is created, so that a volume another machine still has mounted
    (:class:`VolumeMountedElsewhere`) makes the group wait rather than fail a run."""
    if volume_problem() is not None:
        return
    for vol in group_volumes(settings, folder):
        if vol.image.exists() and vol.mounted() is None:
            vol.ensure(0)


def unmount_group(settings: Settings, folder: str) -> bool:
    """Unmount the group's volumes on this machine (a group that moved to another host); True
    once none is mounted nor its image attached to a loop device here any more: only then
    may another machine mount them (``store/volume_holds.py``)."""
    free = True
    for vol in group_volumes(settings, folder):
        if not vol.image.exists():
            continue
        try:
            vol.unmount()
        except VolumeUnavailable as exc:
            log.warning("could not unmount the volume %s of %s: %s", vol.image, folder, exc)
            free = False
            continue
        if _still_attached(vol.image):
            # Still held in another mount namespace (a container that has not exited yet).
            free = False
    return free


def mounted_group_folders(settings: Settings) -> list[str]:
    """The group folders with a volume mounted on this machine (its workspace's or its
    session folder's), read from the images' loop devices and this mount table."""
    vdir = volumes_dir(settings)
    if not vdir.is_dir():
        return []
    found: dict[str, None] = {}
    for image in sorted(vdir.glob("*.img")):
        vol = _volume_named(settings, image.name[: -len(".img")])
        if vol is not None and loop_devices_of(vol.image) and vol.mounted() == "ours":
            found[vol.group or vol.folder] = None
    return list(found)


def unmount_all(settings: Settings) -> list[str]:
    """Unmount every group volume of this data dir (the images stay); returns their names."""
    done: list[str] = []
    vdir = volumes_dir(settings)
    if not vdir.is_dir():
        return done
    for image in sorted(vdir.glob("*.img")):
        folder = image.name[: -len(".img")]
        vol = _volume_named(settings, folder)
        if vol is None:
            continue
        try:
            if vol.unmount():
                done.append(folder)
        except VolumeUnavailable as exc:  # even the lazy umount failed: say which, as the CLI's one-line error
            raise WorkspaceQuotaError(f"could not unmount the workspace volume of {folder!r}: {exc}") from exc
    return done


# -- scratch volumes (a replay's copy of a workspace) ------------------------------------


@contextlib.contextmanager
def scratch_volume(settings: Settings, name: str, where: Path, quota: int) -> Iterator[bool]:
    """A throw-away volume of ``quota`` bytes mounted at the empty folder ``where`` for the
    block's life (a replay's scratch copy): what a container writes there stops at the
    quota, as in the group's own workspace.  Yields whether it is bounded: not when there
    is no quota, nor where this host cannot loop-mount (checked mode, which measures
    before a run, cannot stop one that writes as it goes: such a host says so at start).

    On the way out the volume is unmounted and its image deleted.  A worker killed in
    the block leaves both; the next scratch volume of the data dir removes them (each
    one in use holds a lock its process's death releases)."""
    if quota == 0 or quota_mode(settings, quota)[0] != "volume" or volume_problem() is not None:
        yield False
        return
    vdir = volumes_dir(settings)
    vdir.mkdir(mode=0o700, parents=True, exist_ok=True)
    remove_stale_scratch(settings)
    vol = Volume.of(settings, SCRATCH_PREFIX + name, where)
    in_use = os.open(vdir / f"{vol.folder}.inuse", os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
    try:
        fcntl.flock(in_use, fcntl.LOCK_EX)
        try:
            vol.ensure(quota)
        except VolumeUnavailable as exc:
            raise WorkspaceQuotaError(f"cannot bound the scratch copy with a volume: {exc}") from exc
        try:
            yield True
        finally:
            _discard_scratch(vol)
    finally:
        os.close(in_use)  # the lock goes with it


def remove_stale_scratch(settings: Settings) -> list[str]:
    """Unmount and delete the scratch volumes no live process holds (a killed replay's)."""
    vdir = volumes_dir(settings)
    removed: list[str] = []
    for image in sorted(vdir.glob(f"{SCRATCH_PREFIX}*.img")):
        folder = image.name[: -len(".img")]
        try:
            fd = os.open(vdir / f"{folder}.inuse", os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
        except OSError:
            continue
        try:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                continue  # in use
            backing = str(Path(os.path.realpath(vdir)) / image.name)
            mounted = [
                m.mount_point
                for m in mount_entries()
                if m.source.startswith("/dev/loop") and loop_backing_file(m.source) == backing
            ]
            for where in mounted:
                _discard_scratch(Volume(settings, folder, Path(where)))
            if not mounted:
                _discard_scratch(Volume(settings, folder, vdir / f"{folder}.none"))
            removed.append(folder)
        finally:
            os.close(fd)
    return removed


def _discard_scratch(vol: Volume) -> None:
    try:
        vol.unmount()
    except VolumeUnavailable as exc:  # even the lazy unmount failed: the image stays, for the next try
        log.warning("could not unmount the scratch volume %s: %s", vol.image, exc)
        return
    # The kernel detaches the autoclear loop device a moment after the last unmount;
    # wait for it so that leaving the block leaves nothing, and detach it if it lingers.
    for dev in _still_attached(vol.image):
        try:
            _run(["losetup", "-d", dev])
        except VolumeUnavailable as exc:
            log.warning("could not detach %s from the scratch volume %s: %s", dev, vol.image, exc)
    for path in (vol.image, vol.lock, volumes_dir(vol.settings) / f"{vol.folder}.inuse"):
        with contextlib.suppress(FileNotFoundError):
            path.unlink()
