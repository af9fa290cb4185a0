"""The workspace quota: how much disk one group's workspace may take.

Why this exists: the workspace ``<data>/groups/<folder>`` is the one host
folder a run container writes (bind-mounted read-write at ``/workspace``),
and it sits on the filesystem that also holds the SQLite database and the
embedded broker.  Without a limit, ``fallocate -l 500G x`` inside the
sandbox fills that filesystem and stops every group of the installation.

The quota is enforced in one of two modes, chosen once per process (``mode.py``):

* **volume** (the host runs as root, with loop devices and e2fsprogs): the
  workspace is an ext4 filesystem in an image file, loop-mounted at the
  workspace path before the container is created (``volume.py``); a full
  workspace is ``No space left on device`` inside the sandbox.
* **checked** (anything else): before each run the workspace's disk usage is
  measured by a bounded walk, and a workspace over its quota is refused
  (``usage.py``).  This does not stop a run from filling the disk *while it runs*.

The modules, one concept each: ``mode.py`` (which mode, and why), ``workspace.py``
(the hook before a run), ``usage.py`` (the bounded walk and the checked mode's
refusal), ``volume.py`` (a group's volume made, filled, grown and mounted),
``ext4.py`` (the image file and its filesystem), ``loop.py`` (loop devices,
mounts and the programs run for them), ``tree_copy.py`` (a folder's files moved
into its new volume), ``groups.py`` (a group's volumes on this machine),
``scratch.py`` (a replay's scratch volume) and ``report.py`` (usage against the
quota, for the command line).

Everything inside a workspace is the agent's and hostile: the walk and the
move open entries relative to directory descriptors with ``O_NOFOLLOW``,
regular files only with ``O_NONBLOCK``, and skip FIFOs, sockets and devices.
A refusal is a :class:`~orchestrator.core.errors.WorkspaceQuotaError`.
"""

from orchestrator.sandbox.quota.groups import (
    group_volumes,
    mount_existing,
    mounted_group_folders,
    unmount_all,
    unmount_group,
)
from orchestrator.sandbox.quota.loop import VolumeUnavailable, loop_backing_file, loop_devices_of
from orchestrator.sandbox.quota.mode import QuotaMode, describe_mode, quota_mode, volume_problem, workspace_quota_bytes
from orchestrator.sandbox.quota.report import QuotaReport, report
from orchestrator.sandbox.quota.scratch import remove_stale_scratch, scratch_volume
from orchestrator.sandbox.quota.usage import MAX_DEPTH, MAX_ENTRIES, Usage, check_usage, measure
from orchestrator.sandbox.quota.volume import SCRATCH_PREFIX, SESSION_PREFIX, Volume, volumes_dir
from orchestrator.sandbox.quota.workspace import prepare_workspace

__all__ = [
    "MAX_DEPTH",
    "MAX_ENTRIES",
    "SCRATCH_PREFIX",
    "SESSION_PREFIX",
    "QuotaMode",
    "QuotaReport",
    "Usage",
    "Volume",
    "VolumeUnavailable",
    "check_usage",
    "describe_mode",
    "group_volumes",
    "loop_backing_file",
    "loop_devices_of",
    "measure",
    "mount_existing",
    "mounted_group_folders",
    "prepare_workspace",
    "quota_mode",
    "remove_stale_scratch",
    "report",
    "scratch_volume",
    "unmount_all",
    "unmount_group",
    "volume_problem",
    "volumes_dir",
    "workspace_quota_bytes",
]
