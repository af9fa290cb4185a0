"""Which way this process keeps workspaces under their quota: a volume, a check, or not at all.

The quota is ``ORCHESTRATOR_WORKSPACE_QUOTA`` (a size such as ``2g``; ``0``: no quota;
``auto``: :func:`default_quota`), or a group's ``workspace_quota`` in its
``container_config``.  The mode is chosen once per process (:func:`quota_mode`,
``ORCHESTRATOR_WORKSPACE_QUOTA_MODE``: ``auto``, ``volume`` or ``checked``) and logged when
a worker starts (:func:`describe_mode`): ``volume`` where the host runs as root with loop
devices and e2fsprogs (:func:`volume_problem` says why not), ``checked`` anywhere else.  A
volume that cannot be made sends an ``auto`` process to the check for a while
(:func:`volumes_failed`, :data:`RETRY_VOLUMES_S`).
"""

from __future__ import annotations

import functools
import os
import shutil
import time
from typing import Literal

from orchestrator.core.settings import Settings
from orchestrator.core.sizes import human_size, parse_quota

QuotaMode = Literal["off", "volume", "checked"]

TOOLS = ("mkfs.ext4", "e2fsck", "resize2fs", "tune2fs", "losetup", "mount", "umount")
AUTO_QUOTA_BYTES = 2 * 1024**3

_modes: dict[str, tuple[QuotaMode, str]] = {}
# data dir -> (when, why) making a volume last failed in this process; checked mode for a while
_volume_broken: dict[str, tuple[float, str]] = {}
RETRY_VOLUMES_S = 300.0


def workspace_quota_bytes(settings: Settings) -> int:
    """The installation's workspace quota in bytes (0: none), ``auto`` resolved for this host."""
    if settings.sandbox.workspace_quota == "auto":
        return default_quota(settings)
    return parse_quota(settings.sandbox.workspace_quota)


def default_quota(settings: Settings) -> int:
    """``ORCHESTRATOR_WORKSPACE_QUOTA=auto``: :data:`AUTO_QUOTA_BYTES` where a
    volume enforces it (nothing can outgrow it, even mid-run), none where only
    the checked mode could (its walk would cost every run of every group)."""
    if settings.sandbox.workspace_quota_mode == "checked":
        return 0
    mode, _ = quota_mode(settings, AUTO_QUOTA_BYTES)
    return AUTO_QUOTA_BYTES if mode == "volume" else 0


def quota_mode(settings: Settings, quota: int | None = None) -> tuple[QuotaMode, str]:
    """How a quota is enforced in this process, and why (cached per process)."""
    if quota is None:
        quota = workspace_quota_bytes(settings)
    if quota == 0:
        if settings.sandbox.workspace_quota == "auto":
            return "off", "ORCHESTRATOR_WORKSPACE_QUOTA=auto, and this host cannot loop-mount volumes"
        return "off", "no workspace quota (ORCHESTRATOR_WORKSPACE_QUOTA=0)"
    wanted = settings.sandbox.workspace_quota_mode
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


def volumes_failed(settings: Settings, why: str) -> None:
    """Making a volume failed here: an ``auto`` process checks usage instead for
    :data:`RETRY_VOLUMES_S`, then tries volumes again."""
    _volume_broken[str(settings.data_dir)] = (time.monotonic(), why)


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
