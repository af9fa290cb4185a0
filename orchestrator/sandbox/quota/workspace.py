"""A workspace put under its quota before a run container is created: the one hook the run path calls.

The mode (``mode.py``) says how: in volume mode the group's volume is made, mounted or
grown (``volume.py``); in checked mode the usage is measured and a workspace over its quota
is refused (``usage.py``).  A workspace whose files already live in a volume never runs on
the empty folder under it, whatever the mode; a folder that is an operator's own mount
(XFS project quota, a separate disk) is left as it is.  A refusal is a
:class:`~orchestrator.core.errors.WorkspaceQuotaError`: the run fails at once.
"""

from __future__ import annotations

import logging
from pathlib import Path

from orchestrator.core.errors import WorkspaceQuotaError
from orchestrator.core.settings import Settings
from orchestrator.sandbox.quota.loop import VolumeUnavailable
from orchestrator.sandbox.quota.mode import RETRY_VOLUMES_S, quota_mode, volume_problem, volumes_failed
from orchestrator.sandbox.quota.usage import check_usage
from orchestrator.sandbox.quota.volume import Volume

log = logging.getLogger(__name__)


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
            if settings.sandbox.workspace_quota_mode == "volume":
                raise WorkspaceQuotaError(f"cannot set up the {what} volume of {folder!r}: {exc}") from exc
            volumes_failed(settings, str(exc))
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
