"""A volume's image on a loop device: which devices back an image, what is mounted where,
mounting an image and unmounting it, and the host programs run for it.

Every answer about devices and mounts is read from the kernel without running a program
(``/sys/block/loopN/loop/backing_file``, ``/proc/self/mountinfo``); the programs that change
anything (``losetup``, ``mount``, e2fsprogs) run bounded in time, and their failure is a
:class:`VolumeUnavailable`, which a caller turns into a ``WorkspaceQuotaError`` or into the
checked mode's fallback.
"""

from __future__ import annotations

import contextlib
import os
import re
import subprocess
import time
from pathlib import Path
from typing import Literal

from orchestrator.core.errors import VolumeMountedElsewhere
from orchestrator.sandbox import mmp
from orchestrator.sandbox.late_mounts import MountEntry, mount_entries

MOUNT_OPTIONS = "nosuid,nodev,discard"
COMMAND_TIMEOUT_S = 120.0

MountState = Literal["ours", "foreign"] | None


class VolumeUnavailable(Exception):
    """A new volume could not be made or mounted (the caller may fall back to checking)."""


def run_tool(argv: list[str], ok: tuple[int, ...] = (0,)) -> str:
    """Run one of the volume's programs; its stdout, or :class:`VolumeUnavailable` with its last error line."""
    try:
        res = subprocess.run(argv, capture_output=True, text=True, timeout=COMMAND_TIMEOUT_S, check=False)
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise VolumeUnavailable(f"{argv[0]}: {exc}") from exc
    if res.returncode not in ok:
        detail = (res.stderr or res.stdout).strip().splitlines()
        raise VolumeUnavailable(f"{' '.join(argv[:2])} failed ({res.returncode}): {detail[-1] if detail else ''}")
    return res.stdout


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


def still_attached(image: Path, wait_s: float = 3.0) -> list[str]:
    """Loop devices still on ``image`` after its last unmount; the kernel detaches an
    autoclear device a moment later, so wait a little before calling it held."""
    deadline = time.monotonic() + wait_s
    while True:
        devices = loop_devices_of(image)
        if not devices or time.monotonic() > deadline:
            return devices
        time.sleep(0.02)


def _top_mount(path: str) -> MountEntry | None:
    hits = [e for e in mount_entries() if e.mount_point == path]
    return hits[-1] if hits else None


def mount_state(image: Path, where: Path) -> MountState:
    """Is ``image`` mounted at ``where`` (on top), something else, or nothing?"""
    entry = _top_mount(str(where))
    if entry is None:
        return None
    return "ours" if loop_backing_file(entry.source) == str(image) else "foreign"


def mount_image(image: Path, target: Path, folder: str) -> None:
    """Mount ``image`` (the volume of ``folder``) at ``target`` on a loop device of its own;
    :class:`VolumeMountedElsewhere` when another machine's kernel has it mounted."""
    # A loop device of its own, never one already on the image (what ``mount -o loop``
    # reuses): a second mount of the same device would share the first's filesystem and
    # skip the multiple-mount check that is the fence between machines (sandbox/mmp.py).
    device = run_tool(["losetup", "--find", "--show", str(image)]).strip()
    try:
        run_tool(["mount", "-t", "ext4", "-o", MOUNT_OPTIONS, device, str(target)])
    except VolumeUnavailable:
        with contextlib.suppress(VolumeUnavailable):
            run_tool(["losetup", "-d", device])
        block = mmp.read_block(image)
        if block is not None and block.in_use:
            # Refused by the multiple-mount protection: another kernel has it mounted.
            raise VolumeMountedElsewhere(folder, block.node) from None
        raise
    # Detached once unmounted (the kernel marks a busy device to clear itself), as
    # ``mount -o loop`` leaves it.
    with contextlib.suppress(VolumeUnavailable):
        run_tool(["losetup", "-d", device])
    if mount_state(image, target) != "ours":
        raise VolumeUnavailable(f"mounted {image} at {target}, but /proc/self/mountinfo does not show it")


def umount(target: Path) -> None:
    run_tool(["umount", str(target)])
