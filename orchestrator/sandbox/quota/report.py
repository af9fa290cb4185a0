"""What a group's workspace takes on disk, against its quota (``orchestrator groups quota``).

A mounted volume's use is its filesystem's (``statvfs``); anything else is measured by the
bounded walk (``usage.py``), and a walk that stopped says so in the report's note.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

from orchestrator.core.settings import Settings
from orchestrator.core.sizes import human_size
from orchestrator.sandbox.quota.mode import QuotaMode, quota_mode
from orchestrator.sandbox.quota.usage import measure
from orchestrator.sandbox.quota.volume import Volume


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
