"""System notices: ephemeral context computed fresh for every run.

Each provider looks at the current state and returns zero or more short
notices.  They go to the container in ``ContainerInput.system_notices`` (the
runner appends them to the system prompt) and are never stored: they say how
things are *now*, so a stored copy would soon be false.  Persistent context
is a stored ``system`` message instead.  A provider that fails is logged and
skipped; a notice is never worth failing a run for.
"""

from __future__ import annotations

import logging
import os
import subprocess
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path

from .db import Database
from .groups import Group
from .runs import list_runs
from .schedules import list_tasks
from .settings import Settings

log = logging.getLogger(__name__)

LARGE_FILE_BYTES = 50 * 1024 * 1024
MAX_FILES_SCANNED = 20_000
DUE_SOON = timedelta(hours=1)
GIT_TIMEOUT_S = 3.0
MAX_LISTED = 5


@dataclass(frozen=True)
class NoticeContext:
    db: Database
    settings: Settings
    group: Group

    @property
    def workspace(self) -> Path:
        return self.settings.groups_dir / self.group.folder


NoticeProvider = Callable[[NoticeContext], list[str]]


def previous_run_failed(ctx: NoticeContext) -> list[str]:
    recent = [r for r in list_runs(ctx.db, chat_jid=ctx.group.chat_jid, limit=5) if r.finished_at is not None]
    if recent and recent[0].state in ("failed", "timed_out"):
        last = recent[0]
        why = (last.error or "unknown error").splitlines()[0][:200]
        return [f"Note: the previous agent run in this chat ended as {last.state}: {why}"]
    return []


def uncommitted_changes(ctx: NoticeContext) -> list[str]:
    """The workspace is a git repository with changes not yet committed."""
    if not (ctx.workspace / ".git").exists():
        return []
    try:
        done = subprocess.run(
            ["git", "-C", str(ctx.workspace), "status", "--porcelain"],
            capture_output=True, text=True, timeout=GIT_TIMEOUT_S, check=False,
        )
    except (OSError, subprocess.TimeoutExpired) as exc:
        log.info("git status in %s failed: %s", ctx.workspace, exc)
        return []
    changed = [line[3:] for line in done.stdout.splitlines() if len(line) > 3]
    if done.returncode != 0 or not changed:
        return []
    shown = ", ".join(changed[:MAX_LISTED]) + (f" and {len(changed) - MAX_LISTED} more" if len(changed) > MAX_LISTED else "")
    return [f"Note: the workspace has {len(changed)} uncommitted change(s): {shown}."]


def large_files(ctx: NoticeContext) -> list[str]:
    """Files big enough that reading them whole would waste the context."""
    found: list[tuple[int, str]] = []
    scanned = 0
    for root, dirs, files in os.walk(ctx.workspace):
        dirs[:] = [d for d in dirs if d != ".git"]
        for name in files:
            scanned += 1
            path = Path(root, name)
            try:
                size = path.lstat().st_size
            except OSError:
                continue
            if size >= LARGE_FILE_BYTES:
                found.append((size, str(path.relative_to(ctx.workspace))))
        if scanned >= MAX_FILES_SCANNED:
            break
    if not found:
        return []
    found.sort(reverse=True)
    listed = ", ".join(f"{p} ({s // (1024 * 1024)} MiB)" for s, p in found[:MAX_LISTED])
    return [f"Note: very large files in the workspace (read them in parts, not whole): {listed}."]


def scheduled_tasks_due(ctx: NoticeContext) -> list[str]:
    now = datetime.now(UTC)
    due = sorted(
        (t for t in list_tasks(ctx.db, chat_jid=ctx.group.chat_jid)
         if t.state == "active" and t.next_run_at is not None and t.next_run_at <= now + DUE_SOON),
        key=lambda t: t.next_run_at or now,
    )
    if not due:
        return []
    parts = [f'"{t.prompt[:60]}" at {t.next_run_at:%H:%M} UTC' for t in due[:MAX_LISTED]]  # type: ignore[str-format]
    return [f"Note: scheduled tasks due within the hour: {'; '.join(parts)}."]


DEFAULT_PROVIDERS: list[NoticeProvider] = [previous_run_failed, uncommitted_changes, large_files, scheduled_tasks_due]


def compute_notices(
    db: Database, settings: Settings, group: Group, providers: list[NoticeProvider] | None = None
) -> list[str]:
    ctx = NoticeContext(db, settings, group)
    notices: list[str] = []
    for provider in providers if providers is not None else DEFAULT_PROVIDERS:
        try:
            notices.extend(provider(ctx))
        except Exception:  # noqa: BLE001 - see the module docstring
            log.exception("notice provider %s failed; skipped", getattr(provider, "__name__", provider))
    return notices
