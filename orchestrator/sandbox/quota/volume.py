"""A group's volume: an ext4 image loop-mounted at its workspace (or its session folder).

In volume mode (``mode.py``) the workspace is a filesystem of its own, loop-mounted
``nosuid,nodev,discard`` at the workspace path before the container is created.  A full
workspace is ``No space left on device`` inside the sandbox; the data dir's filesystem gives
a group at most its quota (and gets it back as the agent deletes files: ``discard`` punches
holes in the image).  Setting up (:meth:`Volume.ensure`) is idempotent and safe across
threads and worker processes (a file lock, then ``/proc/self/mountinfo`` says whether the
image is mounted there already); what the workspace held before is moved into the new
filesystem (``tree_copy.py``); the image is made and grown in ``ext4.py``, mounted in
``loop.py``.
"""

from __future__ import annotations

import contextlib
import fcntl
import logging
import os
import stat
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from orchestrator.core.errors import WorkspaceQuotaError
from orchestrator.core.settings import Settings
from orchestrator.core.sizes import human_size
from orchestrator.sandbox.quota.ext4 import grow_online, grow_unmounted, make_image, protect
from orchestrator.sandbox.quota.loop import MountState, VolumeUnavailable, mount_image, mount_state, run_tool, umount
from orchestrator.sandbox.quota.tree_copy import move_content
from orchestrator.sandbox.quota.usage import OPEN_DIR

log = logging.getLogger(__name__)

# Volumes that are not a group's workspace are named with a dot, which no group
# folder can hold (store/groups.py's slug): a replay's scratch copy, a session folder.
SCRATCH_PREFIX = "replay."
SESSION_PREFIX = "session."


def volumes_dir(settings: Settings) -> Path:
    """Host-only: the images of the workspace volumes (never mounted into a container)."""
    return settings.data_dir / "volumes"


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

    def mounted(self, where: Path | None = None) -> MountState:
        """Is our image mounted at the workspace (or ``where``), something else, or nothing?"""
        return mount_state(self.image, where or self.workspace)

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
                protect(self.image)
            if fresh:
                make_image(self.image, quota, self.folder)
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

    def _put_in_place(self, fresh: bool, moved: list[bool]) -> None:
        """Mount the image at the workspace, moving what the folder holds into it first
        (``moved`` gets an item once the folder has been emptied into the image)."""
        # A warm container holds the folder as it is now: it must not keep writing there.
        _stop_warm(self.settings, self.group or self.folder)
        self.workspace.mkdir(parents=True, exist_ok=True)
        ws_fd = os.open(self.workspace, OPEN_DIR)
        try:
            ws_st = os.fstat(ws_fd)
            with os.scandir(ws_fd) as it:
                has_content = any(True for _ in it)
            if has_content:
                # The folder under the mount would be hidden, never seen again: fill the
                # volume through a host-only mount point first, then empty the folder.
                self.staging.mkdir(mode=0o700, exist_ok=True)
                if self.mounted(self.staging) != "ours":
                    mount_image(self.image, self.staging, self.folder)
                try:
                    dst = os.open(self.staging, OPEN_DIR)
                    try:
                        with contextlib.suppress(OSError):
                            os.rmdir("lost+found", dir_fd=dst)
                        if fresh:
                            _settle_root(dst, ws_st)
                        move_content(ws_fd, dst, moved, folder=self.folder, workspace=self.workspace)
                    finally:
                        os.close(dst)
                finally:
                    umount(self.staging)
        finally:
            os.close(ws_fd)
        mount_image(self.image, self.workspace, self.folder)
        dst = os.open(self.workspace, OPEN_DIR)
        try:
            if fresh and not has_content:
                _settle_root(dst, ws_st)
            # mkfs and e2fsck make one; an empty one is dropped (the workspace is the agent's).
            with contextlib.suppress(OSError):
                os.rmdir("lost+found", dir_fd=dst)
        finally:
            os.close(dst)

    def _grow(self, quota: int, *, mounted: bool) -> None:
        """Grow the image and its filesystem to ``quota``.  Where that cannot be done now, the
        volume keeps its size (and the image its length, so the next run tries again)."""
        old = self.size()
        started = time.monotonic()
        if mounted:
            if grow_online(self.image, quota, old):
                return
            # Unmounted growth: no container may hold the filesystem meanwhile.
            _stop_warm(self.settings, self.group or self.folder)
            umount(self.workspace)
        try:
            grown = grow_unmounted(self.image, quota, old)
        finally:
            if mounted:
                mount_image(self.image, self.workspace, self.folder)
                with contextlib.suppress(OSError):
                    os.rmdir(self.workspace / "lost+found")  # e2fsck's
        if grown:
            log.info(
                "workspace volume %s grown from %s to %s in %.3fs",
                self.image,
                human_size(old),
                human_size(quota),
                time.monotonic() - started,
            )

    def unmount(self) -> bool:
        """Unmount the volume from the workspace (and the staging point); the image stays."""
        with _locked(self.lock):
            done = False
            for where in (self.workspace, self.staging):
                while self.mounted(where) == "ours":
                    try:
                        umount(where)
                    except VolumeUnavailable:
                        run_tool(["umount", "-l", str(where)])
                    done = True
            return done


def _settle_root(fd: int, like: os.stat_result) -> None:
    """A new volume's root gets the folder's owner and mode."""
    os.fchown(fd, like.st_uid, like.st_gid)
    os.fchmod(fd, stat.S_IMODE(like.st_mode) & 0o1777)


def _stop_warm(settings: Settings, folder: str) -> None:
    if settings.sandbox.warm_idle_s <= 0:
        return
    try:
        from orchestrator.sandbox.containers import docker_client
        from orchestrator.sandbox.warm import WarmPool

        WarmPool(settings, docker_client(settings)).stop(folder)
    except Exception as exc:  # noqa: BLE001 - no Docker: no warm container either
        log.warning("could not stop the warm container of %s: %s", folder, exc)
