"""The schedule tools: the agent makes and manages its group's scheduled tasks.

``schedule_task``, ``update_task``, ``pause_task``, ``resume_task`` and ``cancel_task``
each emit a ``task`` event (:class:`~agent_runner.protocol.TaskEvent`); ``list_tasks``
answers from the tasks the host gave the run (``ContainerInput.tasks``, as they were when
it started).  The runner refuses early only what it can see is wrong (a missing field, a
kind it does not know, another group's chat when this run may not post there, a task id
it was not given); the host decides for real when the event arrives: whose task it is,
the schedule's validity, the group's cap and the shortest interval, and it says in the
chat what it did.  A task the agent made is marked so on the host.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, get_args

from ..protocol import ContextMode, ScheduleKind, TaskAction, TaskEvent, TaskInfo
from ..providers.base import ToolSpec
from .base import ToolContext, ToolOutcome, bad_input, failed, str_arg

MAX_PROMPT_CHARS = 10_000
KINDS: tuple[str, ...] = get_args(ScheduleKind)
MODES: tuple[str, ...] = get_args(ContextMode)

_WHEN = {
    "kind": {
        "type": "string",
        "enum": list(KINDS),
        "description": "cron: a five-field cron line (UTC); interval: every N seconds/minutes/hours/days; "
        "once: a single ISO-8601 time.",
    },
    "spec": {
        "type": "string",
        "description": "For cron '0 9 * * 1-5'; for interval '30m', '2h', '1d'; for once '2026-12-01T09:00:00Z'.",
    },
}
_TASK_ID = {"task_id": {"type": "string", "description": "The task's id (or the start of it), from list_tasks."}}

SPECS = {
    "schedule_task": ToolSpec(
        name="schedule_task",
        description=(
            "Schedule a prompt to run later as a message to you in this chat: on a cron line, every interval, "
            "or once. The host checks it and says in the chat whether it was scheduled."
        ),
        input_schema={
            "type": "object",
            "properties": {
                "prompt": {"type": "string", "description": "What you will be asked each time it runs."},
                **_WHEN,
                "context_mode": {
                    "type": "string",
                    "enum": list(MODES),
                    "description": "group (default): with this chat's history; isolated: the prompt alone.",
                },
                "chat_jid": {"type": "string", "description": "The group it is for (default: this chat)."},
            },
            "required": ["prompt", "kind", "spec"],
        },
    ),
    "list_tasks": ToolSpec(
        name="list_tasks",
        description="The scheduled tasks you may manage, as they were when this run started.",
        input_schema={"type": "object", "properties": {}, "required": []},
    ),
    "update_task": ToolSpec(
        name="update_task",
        description="Change a scheduled task's prompt or schedule (give the kind and spec together).",
        input_schema={
            "type": "object",
            "properties": {**_TASK_ID, "prompt": {"type": "string"}, **_WHEN},
            "required": ["task_id"],
        },
    ),
    **{
        f"{action}_task": ToolSpec(
            name=f"{action}_task",
            description=f"{action.capitalize()} a scheduled task.",
            input_schema={"type": "object", "properties": dict(_TASK_ID), "required": ["task_id"]},
        )
        for action in ("pause", "resume", "cancel")
    },
}


def _emit(ctx: ToolContext, tool: str, event: TaskEvent, said: str) -> ToolOutcome:
    if ctx.emit is None:
        return failed(tool, "no chat to schedule in outside a run")
    ctx.emit(event)
    return ToolOutcome(f"{said} The host checks it and says in the chat what it did.", 0)


def _when(args: Mapping[str, Any], tool: str, *, required: bool) -> tuple[str | None, str | None] | ToolOutcome:
    kind = str_arg(args, "kind", tool, required=required)
    if isinstance(kind, ToolOutcome):
        return kind
    spec = str_arg(args, "spec", tool, required=required)
    if isinstance(spec, ToolOutcome):
        return spec
    if (kind is None) != (spec is None):
        return bad_input(tool, "give 'kind' and 'spec' together")
    if kind is not None and kind not in KINDS:
        return bad_input(tool, f"'kind' must be one of {', '.join(KINDS)}, not {kind!r}")
    return kind, spec


def _prompt(args: Mapping[str, Any], tool: str, *, required: bool) -> str | None | ToolOutcome:
    prompt = str_arg(args, "prompt", tool, required=required)
    if isinstance(prompt, str) and len(prompt) > MAX_PROMPT_CHARS:
        return bad_input(tool, f"'prompt' is {len(prompt)} characters; the limit is {MAX_PROMPT_CHARS}")
    return prompt


def _task_id(args: Mapping[str, Any], tool: str, ctx: ToolContext) -> str | ToolOutcome:
    task_id = str_arg(args, "task_id", tool)
    if isinstance(task_id, ToolOutcome):
        return task_id
    assert task_id is not None  # required above
    known = [t.id for t in ctx.tasks]
    if not any(t.startswith(task_id) for t in known):
        return failed(tool, f"no task {task_id!r} of yours; list_tasks shows the ones you may manage")
    return task_id


def schedule_task(args: Mapping[str, Any], ctx: ToolContext) -> ToolOutcome:
    tool = "schedule_task"
    prompt = _prompt(args, tool, required=True)
    if isinstance(prompt, ToolOutcome):
        return prompt
    when = _when(args, tool, required=True)
    if isinstance(when, ToolOutcome):
        return when
    mode = str_arg(args, "context_mode", tool, required=False)
    if isinstance(mode, ToolOutcome):
        return mode
    if mode is not None and mode not in MODES:
        return bad_input(tool, f"'context_mode' must be one of {', '.join(MODES)}, not {mode!r}")
    target = str_arg(args, "chat_jid", tool, required=False)
    if isinstance(target, ToolOutcome):
        return target
    if target is not None and target != ctx.chat_jid and target not in ctx.send_targets:
        return failed(tool, f"this group may not schedule tasks for {target!r}; only for its own chat {ctx.chat_jid!r}")
    kind, spec = when
    event = TaskEvent(
        action="create",
        chat_jid=target or ctx.chat_jid,
        prompt=prompt,
        kind=kind,  # type: ignore[arg-type]  # one of KINDS, checked above
        spec=spec,
        context_mode=mode,  # type: ignore[arg-type]  # one of MODES, checked above
    )
    return _emit(ctx, tool, event, f"Asked the host to schedule it ({kind} {spec}).")


def update_task(args: Mapping[str, Any], ctx: ToolContext) -> ToolOutcome:
    tool = "update_task"
    task_id = _task_id(args, tool, ctx)
    if isinstance(task_id, ToolOutcome):
        return task_id
    prompt = _prompt(args, tool, required=False)
    if isinstance(prompt, ToolOutcome):
        return prompt
    when = _when(args, tool, required=False)
    if isinstance(when, ToolOutcome):
        return when
    kind, spec = when
    if prompt is None and kind is None:
        return bad_input(tool, "give a new 'prompt', or a new 'kind' and 'spec', or both")
    event = TaskEvent(action="update", task_id=task_id, prompt=prompt, kind=kind, spec=spec)  # type: ignore[arg-type]
    return _emit(ctx, tool, event, f"Asked the host to change task {task_id}.")


def _state_change(action: TaskAction) -> Any:
    tool = f"{action}_task"

    def change(args: Mapping[str, Any], ctx: ToolContext) -> ToolOutcome:
        task_id = _task_id(args, tool, ctx)
        if isinstance(task_id, ToolOutcome):
            return task_id
        return _emit(
            ctx, tool, TaskEvent(action=action, task_id=task_id), f"Asked the host to {action} task {task_id}."
        )

    return change


pause_task = _state_change("pause")
resume_task = _state_change("resume")
cancel_task = _state_change("cancel")


def list_tasks(args: Mapping[str, Any], ctx: ToolContext) -> ToolOutcome:
    if not ctx.tasks:
        return ToolOutcome("No scheduled tasks (as of the start of this run).", 0)
    return ToolOutcome("\n".join(_line(t) for t in ctx.tasks), 0)


def _line(task: TaskInfo) -> str:
    made = " (made by the agent)" if task.made_by_agent else ""
    due = f", next {task.next_run_at}" if task.next_run_at and task.state == "active" else ""
    return f"{task.id} [{task.state}] {task.kind} {task.spec} in {task.chat_jid}{due}{made}: {task.prompt}"
