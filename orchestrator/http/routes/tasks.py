"""Scheduled tasks: list, read, create, pause, resume and cancel them (``orchestrator tasks``).

What a task is and when it falls due is ``orchestrator/run/schedules.py``'s; these
routes hand it the request and answer with the task.  A task is named by its id or a
unique prefix of it, as on the command line.  A chat that is no registered group, or no
task by that id (or a prefix of several), is a 404; a schedule the rules refuse (a cron
line that is not one or never falls due, an interval that is not one or is shorter than a
second or longer than a year, a time once that is not ISO-8601 or is past) a 400 naming
``spec``; a change the task's state does not allow (resuming an active task, anything
but reading a cancelled or done one) a 409.
"""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Request
from pydantic import BaseModel, ConfigDict, Field

from orchestrator.core.errors import InvalidMessage
from orchestrator.http.contract import NO_NUL_PATTERN
from orchestrator.http.errors import bad_input_in
from orchestrator.http.routes.groups import JID_PATTERN
from orchestrator.http.routes.messages import MAX_CONTENT_CHARS
from orchestrator.http.state import api_state
from orchestrator.run.profile import SPACE_OR_CONTROL
from orchestrator.run.schedules import ScheduledTask, add_task, change_state, get_task, list_tasks
from orchestrator.store.schedules import ContextMode, ScheduleKind

router = APIRouter()

# Some text that is not whitespace or a control character, and no NUL anywhere: what
# add_task takes for a prompt (it refuses a blank one).
PROMPT_PATTERN = rf"^[^\x00]*[^{SPACE_OR_CONTROL}][^\x00]*$"
_NO_TASK: dict[int | str, dict[str, Any]] = {404: {"description": "no task by that id, or a prefix of several"}}
_CHANGED = {
    **_NO_TASK,
    409: {"description": "the task's state does not allow the change (already paused, not paused, ended)"},
}


class NewTask(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)

    chat_jid: str = Field(min_length=1, max_length=256, pattern=JID_PATTERN, description="A registered group.")
    prompt: str = Field(
        min_length=1,
        max_length=MAX_CONTENT_CHARS,
        pattern=PROMPT_PATTERN,
        description="What the agent is asked each time: stored as a message of the group (sender `scheduler`).",
    )
    kind: ScheduleKind = Field(description="How `spec` is read: a cron line, an interval, or a time once.")
    spec: str = Field(
        min_length=1,
        max_length=256,
        pattern=NO_NUL_PATTERN,
        description="cron: five fields, `0 9 * * 1-5` (UTC); interval: a number with an optional unit s, m, h "
        "or d (`90`, `45s`, `30m`, `2h`), from 1 s to a year; once: an ISO-8601 date-time in the future "
        "(UTC without a zone). Refused (400) otherwise.",
    )
    context_mode: ContextMode = Field(
        default="group",
        description="`group`: the run has the group's history and session; `isolated`: the prompt alone.",
    )


@router.get("/tasks", response_model=list[ScheduledTask])
def tasks(request: Request, chat_jid: str | None = None) -> list[ScheduledTask]:
    """Every scheduled task, or the chat's, oldest first (whatever its state)."""
    return list_tasks(api_state(request).db, chat_jid=chat_jid)


@router.post(
    "/tasks",
    status_code=201,
    response_model=ScheduledTask,
    responses={404: {"description": "the chat is no registered group"}},
)
def create_task(request: Request, body: NewTask) -> ScheduledTask:
    """Schedule a prompt for a group; it falls due first at the task's ``next_run_at``."""
    # The body's schema leaves the schedule's own rules to add_task: a refusal of its is the spec's.
    with bad_input_in("spec", InvalidMessage):
        return add_task(
            api_state(request).db,
            chat_jid=body.chat_jid,
            prompt=body.prompt,
            kind=body.kind,
            spec=body.spec,
            context_mode=body.context_mode,
        )


@router.get("/tasks/{task_id}", response_model=ScheduledTask, responses=_NO_TASK)
def task(request: Request, task_id: str) -> ScheduledTask:
    return get_task(api_state(request).db, task_id)


@router.post("/tasks/{task_id}/pause", response_model=ScheduledTask, responses=_CHANGED)
def pause_task(request: Request, task_id: str) -> ScheduledTask:
    """Pause an active task: it keeps its schedule and fires nothing until resumed."""
    return change_state(api_state(request).db, task_id, "pause")


@router.post("/tasks/{task_id}/resume", response_model=ScheduledTask, responses=_CHANGED)
def resume_task(request: Request, task_id: str) -> ScheduledTask:
    """Resume a paused task; what fell due while it was paused is skipped."""
    return change_state(api_state(request).db, task_id, "resume")


@router.post("/tasks/{task_id}/cancel", response_model=ScheduledTask, responses=_CHANGED)
def cancel_task(request: Request, task_id: str) -> ScheduledTask:
    """Cancel an active or paused task for good."""
    return change_state(api_state(request).db, task_id, "cancel")
