"""Sizes as people write them (``"2g"``, ``"512m"``, ``"0"``): workspace quotas and
container memory limits.

A leaf: the settings validate ``ORCHESTRATOR_WORKSPACE_QUOTA`` with it, and
``orchestrator/sandbox/quota/`` (which needs the settings, Docker and the warm
pool) enforces what it parses; the group configuration and the warm pool's
cap read memory limits with it.
"""

from __future__ import annotations

import re

MIN_QUOTA_BYTES = 16 * 1024**2
MAX_QUOTA_BYTES = 16 * 1024**4  # 16 TiB: past any workspace, within what ext4 with 4 KiB blocks holds

_SIZE = re.compile(r"^([0-9]+)([kmgt]?)b?$")
_UNITS = {"": 1, "k": 1024, "m": 1024**2, "g": 1024**3, "t": 1024**4}
# Docker's memory spellings: a bare number or b, k, m, g (no t, no zero).
_MEMORY = re.compile(r"^([1-9][0-9]*)([bkmg]?)$")


def memory_bytes(value: str) -> int:
    """A container memory limit (``"512m"``, ``"2g"``) -> bytes."""
    m = _MEMORY.match(value.strip().lower())
    if not m:
        raise ValueError(f"{value!r} is not a size like '512m' or '2g'")
    return int(m.group(1)) * (1 if m.group(2) == "b" else _UNITS[m.group(2)])


def parse_quota(value: str | int) -> int:
    """``"2g"``, ``"512m"``, ``"0"`` (no quota) -> bytes; at least 16m when not 0."""
    if isinstance(value, int):
        size = value
    else:
        m = _SIZE.match(value.strip().lower())
        if not m:
            raise ValueError(f"{value!r} is not a size like '512m' or '2g' (or '0' for no quota)")
        size = int(m.group(1)) * _UNITS[m.group(2)]
    if size == 0:
        return 0
    if size < MIN_QUOTA_BYTES:
        raise ValueError(f"{value!r} is below the 16m minimum (use '0' for no quota)")
    if size > MAX_QUOTA_BYTES:
        raise ValueError(f"{value!r} is above the 16t maximum")
    return size


def human_size(n: int) -> str:
    """Bytes as people read them (``64.0 MiB``, ``12 B``)."""
    size = float(n)
    for unit in ("B", "KiB", "MiB", "GiB"):
        if size < 1024:
            return f"{size:.0f} {unit}" if unit == "B" else f"{size:.1f} {unit}"
        size /= 1024
    return f"{size:.1f} TiB"
