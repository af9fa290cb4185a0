"""Which machine (and which boot of it) this process runs on.

Hosts of a fleet compare it to tell whether they share a kernel: a loop-mounted group
volume is one mount for every host of a machine, so a live host there may take over a
dead one's mount at once (``store/volume_holds.py``), while a host on another machine
must never mount the same image.  The boot id is part of it because a reboot unmounts
everything: a host that last beat in an earlier boot holds no mount any more.
"""

from __future__ import annotations

from functools import cache
from pathlib import Path

_MACHINE_ID_FILES = ("/etc/machine-id", "/var/lib/dbus/machine-id")
_BOOT_ID_FILE = "/proc/sys/kernel/random/boot_id"


def _first_line(path: str) -> str:
    try:
        return Path(path).read_text(encoding="ascii", errors="replace").strip()
    except OSError:
        return ""


@cache
def _this_machine() -> str:
    machine = next((text for text in map(_first_line, _MACHINE_ID_FILES) if text), "")
    boot = _first_line(_BOOT_ID_FILE)
    if not machine and not boot:
        # Neither is readable (not Linux): the hostname is the best name left.
        import socket

        return f"host:{socket.gethostname()}"
    return f"{machine or 'unknown'}/{boot or 'unknown'}"


def machine_identity(override: str = "") -> str:
    """``override`` (``ORCHESTRATOR_MACHINE_ID``) or ``<machine id>/<boot id>``."""
    return override.strip() or _this_machine()
