"""The agent's schedule tools, decided on the host: a ``task`` event from a run becomes a
scheduled task made, changed, paused, resumed or cancelled, or a refusal, and either way a
🗓 or 🚫 host message in the run's chat.

What the sandbox asks is not trusted.  A group's agent schedules for its own chat; the main
group's for any registered group.  It changes, pauses, resumes and cancels only the tasks the
agent made (``made_by_agent``) in those groups: the operator's tasks are the operator's, and
an agent that rewrote one would have a task outside its cap and its limits that still reads
as the operator's.  A new or changed schedule is checked as an operator's is
(``run/schedules.py``), and more: whatever its kind, it falls due no more often than every
``ORCHESTRATOR_AGENT_TASK_MIN_INTERVAL_S`` (an interval that long at least; a cron line of
five fields whose due times are never closer, no seconds field; a time once at least that far
ahead, so a task that schedules its successor cannot loop faster), and at most
``ORCHESTRATOR_AGENT_TASKS_MAX`` live tasks (active or paused, every kind) the agent made per
group.  A task the agent makes is marked so (``made_by_agent``): a prompt injection may try to
persist through one, and people see which ones the agent made (``orchestrator tasks list``,
``GET /api/tasks``, the announcement in the chat).  Its runs are ordinary runs: the group's
quotas and the fleet's cap hold for them.
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
    cron_fields,
    first_due,
    get_task,
    parse_interval,
    shortest_cron_gap_s,
)
from orchestrator.store.db import Database
from orchestrator.store.groups import Group, get_group
from orchestrator.store.schedules import agent_task_count, live_tasks

TOOLS = {"create": "schedule_task", "update": "update_task", "pause": "pause_task"}


def tool_of(event: TaskEvent) -> str:
    """The tool the agent called for ``event`` (as its refusal names it)."""
    return TOOLS.get(event.action, f"{event.action}_task")


def run_tasks(db: Database, group: Group) -> list[ScheduledTask]:
    """The tasks a run of ``group`` is shown (its own; the main group's: every group's),
    active or paused: one read, for its input and its notices.  Of these it manages only
    the ones the agent made (:func:`handle`)."""
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
            _check_schedule(settings, event.kind, event.spec, now)
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
    _check_schedule(settings, event.kind, event.spec, now)
    cap = settings.runs.agent_tasks_max
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
    if not task.made_by_agent:
        raise InvalidMessage(
            f"task {task.id[:8]} was made by the operator; the agent changes only the tasks it made "
            "(the operator changes this one: orchestrator tasks)"
        )
    return task


def _check_schedule(settings: Settings, kind: str | None, spec: str | None, now: datetime) -> None:
    """Refuse a schedule of the agent's that could fall due more often than every
    ``ORCHESTRATOR_AGENT_TASK_MIN_INTERVAL_S``, whatever its kind (nothing to check without one)."""
    if kind is None or spec is None:
        return
    least = settings.runs.agent_task_min_interval_s
    if kind == "interval" and parse_interval(spec) < least:
        raise InvalidMessage(f"interval {spec!r} is shorter than {least:g}s (ORCHESTRATOR_AGENT_TASK_MIN_INTERVAL_S)")
    if kind == "cron":
        _check_cron(spec, least, now)
    if kind == "once" and (first_due(kind, spec, now) - now).total_seconds() < least:
        raise InvalidMessage(
            f"time {spec!r} is less than {least:g}s from now (ORCHESTRATOR_AGENT_TASK_MIN_INTERVAL_S); "
            "schedule it at least that far ahead"
        )


def _check_cron(spec: str, least: float, now: datetime) -> None:
    first_due("cron", spec, now)  # a cron line at all, one that falls due: as an operator's
    if cron_fields(spec) > 5:
        raise InvalidMessage(
            f"cron line {spec!r} has a seconds field, and the agent's tasks fall due at most every {least:g}s "
            "(ORCHESTRATOR_AGENT_TASK_MIN_INTERVAL_S); use five fields (minute hour day month weekday) "
            "or an interval"
        )
    gap = shortest_cron_gap_s(spec)
    if gap < least:
        raise InvalidMessage(
            f"cron line {spec!r} can fall due {gap:g}s apart, sooner than every {least:g}s "
            "(ORCHESTRATOR_AGENT_TASK_MIN_INTERVAL_S); use a sparser cron line or an interval"
        )


def _describe(task: ScheduledTask) -> str:
    when = {"cron": f"cron {task.spec}", "interval": f"every {task.spec}", "once": f"once at {task.spec}"}[task.kind]
    due = f", next {task.next_run_at:%Y-%m-%d %H:%M} UTC" if task.next_run_at and task.state == "active" else ""
    prompt = task.prompt if len(task.prompt) <= 200 else task.prompt[:199] + "…"
    return f"{when}{due}: {prompt}"


def _past(action: str) -> str:
    return {"pause": "paused", "resume": "resumed", "cancel": "cancelled"}[action]
