"""A workspace's disk usage, measured by a bounded walk, and the checked mode's refusal.

The checked mode (``mode.py``: no volume on this host) measures a workspace before each run
(:func:`check_usage`): allocated blocks, a walk that follows no symlink and stops at
:data:`MAX_ENTRIES` entries or :data:`MAX_DEPTH` levels; over the quota, or too large to
measure, the run fails at once, without retries, naming usage and quota.  This does not
stop a run from filling the disk *while it runs*.  The same walk sizes what a folder holds
before it moves into a new volume (``tree_copy.py``) and what ``orchestrator groups quota``
reports (``report.py``).

Everything inside a workspace is the agent's and hostile: the walk opens each folder
relative to its parent's descriptor with ``O_NOFOLLOW`` and counts FIFOs, sockets and
devices as the entries they are, never opening them.
"""

from __future__ import annotations

import contextlib
import logging
import os
import stat
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from orchestrator.core.errors import WorkspaceQuotaError
from orchestrator.core.sizes import human_size

log = logging.getLogger(__name__)

# The checked mode's walk (and the move into a new volume) stops here: an
# agent that makes more entries or deeper folders cannot make the host walk
# for long; its run is refused instead.
MAX_ENTRIES = 1_000_000
MAX_DEPTH = 128
MAX_LINKS_TRACKED = 100_000  # hard-linked files the walk remembers, to count each once

OPEN_DIR = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC


@dataclass(frozen=True)
class Usage:
    """What a workspace takes on disk."""

    bytes: int
    entries: int
    complete: bool = True
    why: str = ""  # when not complete: where the walk stopped


def measure(path: Path | int, *, max_entries: int = MAX_ENTRIES, max_depth: int = MAX_DEPTH) -> Usage:  # noqa: C901 - a bounded walk: each bound checked where it is spent
    """Allocated bytes (``st_blocks``) under ``path``: no symlink followed, no other filesystem
    entered, every inode counted once, stopped at ``max_entries`` entries or ``max_depth`` levels.

    Depth first, one open descriptor per level: each folder is opened relative to
    its parent's descriptor with ``O_NOFOLLOW``, so a folder swapped for a
    symlink meanwhile is skipped, never followed.  ``path`` may be a directory descriptor."""
    try:
        root = os.open(".", OPEN_DIR, dir_fd=path) if isinstance(path, int) else os.open(path, OPEN_DIR)
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
                sub = os.open(name, OPEN_DIR, dir_fd=fd)
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
