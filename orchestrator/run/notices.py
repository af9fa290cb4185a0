"""System notices: ephemeral context computed fresh for every run.

Each provider looks at the current state and returns zero or more short
notices.  They go to the container in ``ContainerInput.system_notices`` (the
runner appends them to the system prompt; Claude Code's runner gives them with
the turn's prompt, as a kept CLI's system prompt is fixed) and are never stored: they say how
things are *now*, so a stored copy would soon be false.  Persistent context
is a stored ``system`` message instead.  A provider that fails is logged and
skipped; a notice is never worth failing a run for.

Nothing here looks into a group's folders: what is in the workspace is the
agent's to shape, so notices about it (uncommitted changes, very large
files) are computed by the runner inside the sandbox
(``agent_runner/workspace_notices.py``).  The host once ran ``git status``
in the workspace, and the repository's own ``.git/config`` chose what git
executed on the host.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta

from orchestrator.core.settings import Settings
from orchestrator.store.db import Database
from orchestrator.store.groups import Group
from orchestrator.store.runs import recent_run_ends
from orchestrator.store.schedules import ScheduledTask, live_tasks

log = logging.getLogger(__name__)

DUE_SOON = timedelta(hours=1)
MAX_LISTED = 5


@dataclass(frozen=True)
class NoticeContext:
    db: Database
    settings: Settings
    group: Group
    # The run's live tasks when its caller read them already (the pipeline, for the run's
    # input too: one read for both); None: read here.
    tasks: list[ScheduledTask] | None = None


NoticeProvider = Callable[[NoticeContext], list[str]]


def previous_run_failed(ctx: NoticeContext) -> list[str]:
    # The newest finished one of the chat's five newest runs (replays are not the chat's).
    ends = recent_run_ends(ctx.db, ctx.group.chat_jid)
    recent = [(state, error) for state, error, finished_at in ends if finished_at is not None]
    if recent and recent[0][0] in ("failed", "timed_out"):
        state, error = recent[0]
        why = (error or "unknown error").splitlines()[0][:200]
        return [f"Note: the previous agent run in this chat ended as {state}: {why}"]
    return []


def scheduled_tasks_due(ctx: NoticeContext) -> list[str]:
    now = datetime.now(UTC)
    chat = ctx.group.chat_jid
    tasks = ctx.tasks if ctx.tasks is not None else live_tasks(ctx.db, chat)
    times = [(t.prompt, t.next_run_at) for t in tasks if t.chat_jid == chat and t.state == "active" and t.next_run_at]
    due = sorted(((prompt, at) for prompt, at in times if at <= now + DUE_SOON), key=lambda t: t[1])
    if not due:
        return []
    parts = [f'"{prompt[:60]}" at {at:%H:%M} UTC' for prompt, at in due[:MAX_LISTED]]
    return [f"Note: scheduled tasks due within the hour: {'; '.join(parts)}."]


DEFAULT_PROVIDERS: list[NoticeProvider] = [previous_run_failed, scheduled_tasks_due]


def compute_notices(
    db: Database,
    settings: Settings,
    group: Group,
    providers: list[NoticeProvider] | None = None,
    *,
    tasks: list[ScheduledTask] | None = None,
) -> list[str]:
    ctx = NoticeContext(db, settings, group, tasks)
    notices: list[str] = []
    for provider in providers if providers is not None else DEFAULT_PROVIDERS:
        try:
            notices.extend(provider(ctx))
        except Exception:  # see the module docstring
            log.exception("notice provider %s failed; skipped", getattr(provider, "__name__", provider))
    return notices
