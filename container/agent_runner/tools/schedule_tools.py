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

from collections.abc import Callable
from typing import Annotated, get_args

from msgspec import Meta

from ..protocol import ContextMode, ScheduleKind, TaskAction, TaskEvent, TaskInfo
from ..providers.base import ToolSpec
from .base import NonBlank, ToolArgs, ToolContext, ToolOutcome, bad_input, failed

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


Prompt = Annotated[NonBlank, Meta(max_length=MAX_PROMPT_CHARS)]


class ScheduleTaskArgs(ToolArgs):
    prompt: Prompt
    kind: ScheduleKind
    spec: NonBlank
    context_mode: ContextMode | None = None
    chat_jid: NonBlank | None = None


class TaskIdArgs(ToolArgs):
    task_id: NonBlank


class UpdateTaskArgs(TaskIdArgs):
    prompt: Prompt | None = None
    kind: ScheduleKind | None = None
    spec: NonBlank | None = None


class ListTasksArgs(ToolArgs):
    pass


def _known(task_id: str, tool: str, ctx: ToolContext) -> ToolOutcome | None:
    """A refusal unless ``task_id`` starts the id of a task the run was given."""
    if any(t.id.startswith(task_id) for t in ctx.tasks):
        return None
    return failed(tool, f"no task {task_id!r} of yours; list_tasks shows the ones you may manage")


def schedule_task(args: ScheduleTaskArgs, ctx: ToolContext) -> ToolOutcome:
    tool = "schedule_task"
    target = args.chat_jid
    if target is not None and target != ctx.chat_jid and target not in ctx.send_targets:
        return failed(tool, f"this group may not schedule tasks for {target!r}; only for its own chat {ctx.chat_jid!r}")
    event = TaskEvent(
        action="create",
        chat_jid=target or ctx.chat_jid,
        prompt=args.prompt,
        kind=args.kind,
        spec=args.spec,
        context_mode=args.context_mode,
    )
    return _emit(ctx, tool, event, f"Asked the host to schedule it ({args.kind} {args.spec}).")


def update_task(args: UpdateTaskArgs, ctx: ToolContext) -> ToolOutcome:
    tool = "update_task"
    unknown = _known(args.task_id, tool, ctx)
    if unknown is not None:
        return unknown
    if (args.kind is None) != (args.spec is None):
        return bad_input(tool, "give 'kind' and 'spec' together")
    if args.prompt is None and args.kind is None:
        return bad_input(tool, "give a new 'prompt', or a new 'kind' and 'spec', or both")
    event = TaskEvent(action="update", task_id=args.task_id, prompt=args.prompt, kind=args.kind, spec=args.spec)
    return _emit(ctx, tool, event, f"Asked the host to change task {args.task_id}.")


def _state_change(action: TaskAction) -> Callable[[TaskIdArgs, ToolContext], ToolOutcome]:
    tool = f"{action}_task"

    def change(args: TaskIdArgs, ctx: ToolContext) -> ToolOutcome:
        task_id = args.task_id
        unknown = _known(task_id, tool, ctx)
        if unknown is not None:
            return unknown
        return _emit(
            ctx, tool, TaskEvent(action=action, task_id=task_id), f"Asked the host to {action} task {task_id}."
        )

    return change


pause_task = _state_change("pause")
resume_task = _state_change("resume")
cancel_task = _state_change("cancel")


def list_tasks(_args: ListTasksArgs, ctx: ToolContext) -> ToolOutcome:
    if not ctx.tasks:
        return ToolOutcome("No scheduled tasks (as of the start of this run).", 0)
    return ToolOutcome("\n".join(_line(t) for t in ctx.tasks), 0)


def _line(task: TaskInfo) -> str:
    made = " (made by the agent)" if task.made_by_agent else ""
    due = f", next {task.next_run_at}" if task.next_run_at and task.state == "active" else ""
    return f"{task.id} [{task.state}] {task.kind} {task.spec} in {task.chat_jid}{due}{made}: {task.prompt}"
