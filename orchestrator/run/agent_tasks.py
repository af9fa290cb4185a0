"""The agent's schedule tools, decided on the host: a ``task`` event from a run becomes a
scheduled task made, changed, paused, resumed or cancelled, or a refusal, and either way a
🗓 or 🚫 host message in the run's chat.

What the sandbox asks is not trusted.  A group manages its own tasks; the main group any
registered group's.  A new or changed schedule is checked as an operator's is
(``run/schedules.py``), and more: an interval no shorter than
``ORCHESTRATOR_AGENT_TASK_MIN_INTERVAL_S``, and at most ``ORCHESTRATOR_AGENT_TASKS_MAX`` live
tasks the agent made per group.  A task the agent makes is marked so (``made_by_agent``): a
prompt injection may try to persist through one, and people see which ones the agent made
(``orchestrator tasks list``, ``GET /api/tasks``, the announcement in the chat).  Its runs are
ordinary runs: the group's quotas and the fleet's cap hold for them.
"""

from __future__ import annotations

from datetime import UTC, datetime

from agent_runner.protocol import TaskEvent, TaskInfo
from orchestrator.core.errors import InvalidMessage, OrchestratorError
from orchestrator.core.settings import Settings
from orchestrator.run.schedules import (
    ScheduledTask,
    add_task,
    change_state,
    change_task,
    get_task,
    parse_interval,
)
from orchestrator.store.db import Database
from orchestrator.store.groups import Group, get_group
from orchestrator.store.schedules import agent_task_count, live_tasks

TOOLS = {"create": "schedule_task", "update": "update_task", "pause": "pause_task"}


def tool_of(event: TaskEvent) -> str:
    """The tool the agent called for ``event`` (as its refusal names it)."""
    return TOOLS.get(event.action, f"{event.action}_task")


def run_tasks(db: Database, group: Group) -> list[ScheduledTask]:
    """The tasks a run of ``group`` may manage (its own; the main group's: every group's),
    active or paused: one read, for its input and its notices."""
    return live_tasks(db, None if group.is_main else group.chat_jid)


def task_info(task: ScheduledTask) -> TaskInfo:
    return TaskInfo(
        id=task.id,
        chat_jid=task.chat_jid,
        prompt=task.prompt,
        kind=task.kind,
        spec=task.spec,
        context_mode=task.context_mode,
        state=task.state,
        next_run_at=task.next_run_at.isoformat() if task.next_run_at else None,
        made_by_agent=task.made_by_agent,
    )


def handle(db: Database, settings: Settings, group: Group, event: TaskEvent, *, now: datetime | None = None) -> str:
    """Carry out ``event`` for a run of ``group`` if it may; the host message that says what was done or why not."""
    now = now or datetime.now(UTC)
    try:
        if event.action == "create":
            return _create(db, settings, group, event, now)
        task = _own_task(db, group, event.task_id)
        if event.action == "update":
            _check_interval(settings, event.kind, event.spec)
            changed = change_task(db, task.id, prompt=event.prompt, kind=event.kind, spec=event.spec, now=now)
            return f"🗓 The agent changed task {changed.id[:8]}: {_describe(changed)}"
        changed = change_state(db, task.id, event.action, now=now)
        return f"🗓 The agent {_past(event.action)} task {changed.id[:8]} ({_describe(changed)})"
    except OrchestratorError as exc:
        return f"🚫 {tool_of(event)} refused: {exc}"


def _create(db: Database, settings: Settings, group: Group, event: TaskEvent, now: datetime) -> str:
    target = event.chat_jid or group.chat_jid
    if target != group.chat_jid and not group.is_main:
        raise InvalidMessage(
            f"a non-main group schedules tasks for its own chat ({group.chat_jid}) only, not {target!r}"
        )
    get_group(db, target)  # a registered group, or UnknownGroup
    if event.prompt is None or event.kind is None or event.spec is None:
        raise InvalidMessage("a task needs a prompt, a kind and a spec")
    _check_interval(settings, event.kind, event.spec)
    cap = settings.agent_tasks_max
    if agent_task_count(db, target) >= cap:
        raise InvalidMessage(
            f"{target} has {cap} live tasks the agent made already (ORCHESTRATOR_AGENT_TASKS_MAX); cancel one first"
        )
    task = add_task(
        db,
        chat_jid=target,
        prompt=event.prompt,
        kind=event.kind,
        spec=event.spec,
        context_mode=event.context_mode or "group",
        now=now,
        made_by_agent=True,
    )
    where = "" if target == group.chat_jid else f" for {target}"
    return f"🗓 The agent scheduled task {task.id[:8]}{where}: {_describe(task)}"


def _own_task(db: Database, group: Group, task_id: str | None) -> ScheduledTask:
    if not task_id:
        raise InvalidMessage("which task? (task_id)")
    task = get_task(db, task_id)
    if task.chat_jid != group.chat_jid and not group.is_main:
        # Said as "not found": another group's tasks are not this group's to know of.
        raise InvalidMessage(f"no scheduled task {task_id!r} of this group")
    return task


def _check_interval(settings: Settings, kind: str | None, spec: str | None) -> None:
    if kind == "interval" and spec is not None:
        least = settings.agent_task_min_interval_s
        if parse_interval(spec) < least:
            raise InvalidMessage(
                f"interval {spec!r} is shorter than {least:g}s (ORCHESTRATOR_AGENT_TASK_MIN_INTERVAL_S)"
            )


def _describe(task: ScheduledTask) -> str:
    when = {"cron": f"cron {task.spec}", "interval": f"every {task.spec}", "once": f"once at {task.spec}"}[task.kind]
    due = f", next {task.next_run_at:%Y-%m-%d %H:%M} UTC" if task.next_run_at and task.state == "active" else ""
    prompt = task.prompt if len(task.prompt) <= 200 else task.prompt[:199] + "…"
    return f"{when}{due}: {prompt}"


def _past(action: str) -> str:
    return {"pause": "paused", "resume": "resumed", "cancel": "cancelled"}[action]
