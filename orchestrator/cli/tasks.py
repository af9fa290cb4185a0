"""CLI commands about scheduled tasks (``orchestrator/run/schedules.py``): ``tasks add``,
``list``, ``pause``, ``resume`` and ``cancel``."""

from __future__ import annotations

import json
from typing import Annotated, Optional

import typer

from orchestrator.cli.support import echo as _echo
from orchestrator.cli.support import fail as _fail
from orchestrator.cli.support import setup as _setup
from orchestrator.core.errors import OrchestratorError


def register(tasks_app: typer.Typer) -> None:
    tasks_app.command("add")(tasks_add)
    tasks_app.command("list")(tasks_list)
    tasks_app.command("pause")(tasks_pause)
    tasks_app.command("resume")(tasks_resume)
    tasks_app.command("cancel")(tasks_cancel)


def tasks_add(
    chat_jid: str,
    prompt: Annotated[str, typer.Option(help="What the agent is asked each time.")],
    cron: Annotated[Optional[str], typer.Option(help="A cron line, e.g. '0 9 * * 1-5'.")] = None,
    every: Annotated[Optional[str], typer.Option(help="An interval: 90, 45s, 30m, 2h, 1d.")] = None,
    at: Annotated[Optional[str], typer.Option(help="Once, at an ISO-8601 time (UTC if no zone).")] = None,
    context: Annotated[str, typer.Option(help="group (history and session) or isolated (fresh).")] = "group",
) -> None:
    """Schedule a prompt for group CHAT_JID."""
    from orchestrator.run.schedules import add_task

    chosen = [(k, v) for k, v in (("cron", cron), ("interval", every), ("once", at)) if v]
    if len(chosen) != 1:
        raise _fail(OrchestratorError("give exactly one of --cron, --every, --at"))
    db = _setup().db
    kind, spec = chosen[0]
    try:
        # kind is one of the three names above; context_mode is checked by add_task.
        task = add_task(db, chat_jid=chat_jid, prompt=prompt, kind=kind, spec=spec, context_mode=context)  # type: ignore[arg-type]
    except OrchestratorError as exc:
        raise _fail(exc) from exc
    _echo(
        f"task {task.id[:8]} ({task.kind} {task.spec}, {task.context_mode}) next at {task.next_run_at:%Y-%m-%d %H:%M:%S} UTC"
    )


def tasks_list(
    group: Annotated[
        Optional[str], typer.Option("--chat-jid", "--group", help="Only this chat (--group: its older name).")
    ] = None,
    as_json: Annotated[bool, typer.Option("--json")] = False,
) -> None:
    """List scheduled tasks."""
    from orchestrator.run.schedules import list_tasks

    db = _setup().db
    tasks = list_tasks(db, chat_jid=group)
    if as_json:
        typer.echo(json.dumps([t.model_dump(mode="json") for t in tasks], indent=2))
        return
    for t in tasks:
        nxt = f"{t.next_run_at:%Y-%m-%d %H:%M:%S}" if t.next_run_at else "-"
        by = "agent" if t.made_by_agent else "operator"
        _echo(
            f"{t.id[:8]}  {t.state:9} {t.chat_jid:20} {t.kind:8} {t.spec:16} {t.context_mode:8} next {nxt}  "
            f"runs {t.runs}  by {by:8}  {t.prompt[:40]}"
        )


def _task_action(task_id: str, action: str) -> None:
    from orchestrator.run.schedules import change_state

    db = _setup().db
    try:
        task = change_state(db, task_id, action)
    except OrchestratorError as exc:
        raise _fail(exc) from exc
    typer.echo(f"task {task.id[:8]} is {task.state}")


def tasks_pause(task_id: str) -> None:
    """Pause a task (it keeps its schedule)."""
    _task_action(task_id, "pause")


def tasks_resume(task_id: str) -> None:
    """Resume a paused task (what fell due meanwhile is skipped)."""
    _task_action(task_id, "resume")


def tasks_cancel(task_id: str) -> None:
    """Cancel a task for good."""
    _task_action(task_id, "cancel")
