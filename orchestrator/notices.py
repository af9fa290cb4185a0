"""System notices: ephemeral context computed fresh for every run.

Each provider looks at the current state and returns zero or more short
notices.  They go to the container in ``ContainerInput.system_notices`` (the
runner appends them to the system prompt) and are never stored.
"""

from __future__ import annotations

from collections.abc import Callable

from .db import Database
from .groups import Group
from .runs import list_runs

NoticeProvider = Callable[[Database, Group], list[str]]


def previous_run_failed(db: Database, group: Group) -> list[str]:
    recent = [r for r in list_runs(db, chat_jid=group.chat_jid, limit=5) if r.finished_at is not None]
    if recent and recent[0].state in ("failed", "timed_out"):
        last = recent[0]
        why = (last.error or "unknown error").splitlines()[0][:200]
        return [f"Note: the previous agent run in this chat ended as {last.state}: {why}"]
    return []


DEFAULT_PROVIDERS: list[NoticeProvider] = [previous_run_failed]


def compute_notices(db: Database, group: Group, providers: list[NoticeProvider] | None = None) -> list[str]:
    notices: list[str] = []
    for provider in providers if providers is not None else DEFAULT_PROVIDERS:
        notices.extend(provider(db, group))
    return notices
