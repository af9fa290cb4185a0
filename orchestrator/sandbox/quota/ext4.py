"""A volume's image file and its ext4 filesystem: made, protected, grown; never shrunk.

The image is ``<data>/volumes/<folder>.img``: sparse, its length the quota, root's and 0600
in a 0700 folder no container ever sees.  Its filesystem goes without a journal and
reserved blocks, with the multiple-mount protection that keeps a second machine from
mounting it (``sandbox/mmp.py``).  A larger quota grows it online where the kernel lets
this process, unmounted otherwise; a smaller one is not applied (ext4 is not shrunk under
a live workspace).
"""

from __future__ import annotations

import contextlib
import logging
import os
import shutil
from pathlib import Path

from orchestrator.core.sizes import human_size
from orchestrator.sandbox import mmp
from orchestrator.sandbox.quota.loop import VolumeUnavailable, loop_devices_of, run_tool, still_attached

log = logging.getLogger(__name__)


def make_image(image: Path, quota: int, folder: str) -> None:
    """A new image of ``quota`` bytes for the volume of ``folder``, with its filesystem."""
    if quota <= 0:
        raise VolumeUnavailable("no quota to size a new volume with")
    free = shutil.disk_usage(image.parent).free
    if free < quota:
        log.warning(
            "the data dir's filesystem has %s free, less than the workspace quota %s of %s: "
            "a full workspace could still fill it",
            human_size(free),
            human_size(quota),
            folder,
        )
    tmp = image.with_name(image.name + ".new")
    with contextlib.suppress(FileNotFoundError):
        tmp.unlink()
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
    try:
        os.ftruncate(fd, quota)  # sparse: takes disk only as the agent writes
    finally:
        os.close(fd)
    try:
        # No journal (a scratch workspace; less to write), no reserved blocks, 4 KiB blocks.
        run_tool(
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
                f"ws-{folder}"[:16],
                str(tmp),
            ]
        )
    except BaseException:
        with contextlib.suppress(OSError):
            tmp.unlink()
        raise
    os.rename(tmp, image)


def protect(image: Path) -> None:
    """Turn the multiple-mount protection on for an image made before it was used, while it
    is mounted nowhere on this machine (the hold says nowhere else either: this host's)."""
    if mmp.read_block(image) is not None or not image.exists() or loop_devices_of(image):
        return
    run_tool(mmp.enable_argv(image))
    log.info("workspace volume %s: multiple-mount protection turned on", image)


def grow_online(image: Path, quota: int, old: int) -> bool:
    """Grow the mounted ``image`` from ``old`` to ``quota`` bytes; False (its length as it
    was) where the kernel refuses or nothing has it attached."""
    devices = loop_devices_of(image)
    if not devices:
        return False
    set_length(image, quota)
    try:
        for dev in devices:
            run_tool(["losetup", "-c", dev])
        run_tool(["resize2fs", devices[0]])
    except VolumeUnavailable as exc:
        # Online growth needs CAP_SYS_RESOURCE.  The filesystem did not change: back to its length.
        log.info("growing %s online failed (%s); growing it unmounted", image, exc)
        set_length(image, old)
        for dev in devices:
            with contextlib.suppress(VolumeUnavailable):
                run_tool(["losetup", "-c", dev])
        return False
    log.info("workspace volume %s grown online from %s to %s", image, human_size(old), human_size(quota))
    return True


def grow_unmounted(image: Path, quota: int, old: int) -> bool:
    """Grow the unmounted ``image`` and its filesystem to ``quota``; False where that cannot be
    done now (the volume keeps its size, and the image its length, so the next run tries again)."""
    if still_attached(image):
        # Held in another mount namespace: never resize a live filesystem.
        log.warning("workspace volume %s is in use elsewhere; it stays at %s for now", image, human_size(old))
        return False
    try:
        # resize2fs wants a freshly checked filesystem; 1: e2fsck fixed something
        # (it recreates the lost+found that new volumes go without).
        run_tool(["e2fsck", "-f", "-p", str(image)], ok=(0, 1))
    except VolumeUnavailable as exc:
        log.warning("workspace volume %s stays at %s: %s", image, human_size(old), exc)
        return False
    set_length(image, quota)
    run_tool(["resize2fs", str(image)])
    return True


def set_length(image: Path, length: int) -> None:
    fd = os.open(image, os.O_WRONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
    try:
        os.ftruncate(fd, length)
    finally:
        os.close(fd)
