"""Notices about the workspace, computed inside the sandbox when a run starts.

"The workspace has uncommitted changes" needs ``git status``, and a
repository's own ``.git/config`` decides what git executes
(``core.fsmonitor`` runs on every status, clean filters through
``.gitattributes``).  On the host that was an escape: the agent plants the
config, the host runs it.  Here it runs as the agent, in the agent's own
sandbox, so a hostile repository can only do what the agent could do anyway.
The host never runs a program in, or walks, a group's folders for notices.

Both notices are best effort and bounded: a notice is never worth failing or
stalling a run for.
"""

from __future__ import annotations

import logging
import os
import shutil
import subprocess
from pathlib import Path

log = logging.getLogger(__name__)

LARGE_FILE_BYTES = 50 * 1024 * 1024
MAX_ENTRIES_SCANNED = 20_000
GIT_TIMEOUT_S = 3.0
MAX_LISTED = 5


def _listed(items: list[str]) -> str:
    shown = ", ".join(items[:MAX_LISTED])
    if len(items) > MAX_LISTED:
        shown += f" and {len(items) - MAX_LISTED} more"
    return shown


def uncommitted_changes(workspace: Path) -> list[str]:
    """The workspace is a git repository with changes not yet committed."""
    git = shutil.which("git")
    if git is None or not (workspace / ".git").exists():
        return []
    try:
        done = subprocess.run(
            # No fsmonitor hook: it only slows the status down (the agent's own
            # hook would run as the agent here, which is harmless but useless).
            [git, "-c", "core.fsmonitor=", "-C", str(workspace), "status", "--porcelain"],
            capture_output=True,
            text=True,
            timeout=GIT_TIMEOUT_S,
            check=False,
            stdin=subprocess.DEVNULL,
        )
    except (OSError, subprocess.TimeoutExpired) as exc:
        log.info("git status in %s failed: %s", workspace, exc)
        return []
    changed = [line[3:] for line in done.stdout.splitlines() if len(line) > 3]
    if done.returncode != 0 or not changed:
        return []
    return [f"Note: the workspace has {len(changed)} uncommitted change(s): {_listed(changed)}."]


def large_files(workspace: Path) -> list[str]:
    """Files big enough that reading them whole would waste the context."""
    found: list[tuple[int, str]] = []
    scanned = 0
    stack = [str(workspace)]
    while stack and scanned < MAX_ENTRIES_SCANNED:
        try:
            with os.scandir(stack.pop()) as it:
                entries = list(it)
        except OSError:
            continue
        for entry in entries:
            scanned += 1
            try:
                if entry.is_dir(follow_symlinks=False):
                    if entry.name != ".git":
                        stack.append(entry.path)
                elif entry.is_file(follow_symlinks=False):
                    size = entry.stat(follow_symlinks=False).st_size
                    if size >= LARGE_FILE_BYTES:
                        found.append((size, os.path.relpath(entry.path, workspace)))
            except OSError:
                continue
    if not found:
        return []
    found.sort(reverse=True)
    listed = _listed([f"{p} ({s // (1024 * 1024)} MiB)" for s, p in found])
    return [f"Note: very large files in the workspace (read them in parts, not whole): {listed}."]


def workspace_notices(workspace: Path) -> list[str]:
    notices: list[str] = []
    for provider in (uncommitted_changes, large_files):
        try:
            notices.extend(provider(workspace))
        except Exception:  # see the module docstring
            log.exception("workspace notice %s failed; skipped", provider.__name__)
    return notices
