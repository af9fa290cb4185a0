"""The schedule tools in the runner (agent_runner/tools/schedule_tools.py): each asks the host
with a ``task`` event, refusing early only what it can see is wrong; list_tasks answers the
tasks the run was given; the offline model's ``/schedule`` lines."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from agent_runner.protocol import Limits, TaskEvent, TaskInfo
from agent_runner.providers.offline import tool_requests_in
from agent_runner.tools import ToolContext, run_tool

TASK = TaskInfo(
    id="3f2a9c1e-0000-4000-8000-000000000001",
    chat_jid="team@g.us",
    prompt="standup",
    kind="cron",
    spec="0 9 * * 1-5",
    context_mode="group",
    state="active",
    next_run_at="2026-12-01T09:00:00+00:00",
    made_by_agent=True,
)


def context(tmp_path: Path, **fields: Any) -> tuple[ToolContext, list[Any]]:
    emitted: list[Any] = []
    ctx = ToolContext(
        workspace=tmp_path,
        limits=Limits(),
        chat_jid="team@g.us",
        emit=emitted.append,
        tasks=(TASK,),
        **fields,
    )
    return ctx, emitted


def test_schedule_task_asks_the_host(tmp_path: Path) -> None:
    ctx, emitted = context(tmp_path)
    out = run_tool("schedule_task", {"prompt": "$ echo tick", "kind": "interval", "spec": "60s"}, ctx)
    assert not out.is_error and "The host checks it" in out.output
    assert emitted == [
        TaskEvent(action="create", chat_jid="team@g.us", prompt="$ echo tick", kind="interval", spec="60s")
    ]


@pytest.mark.parametrize(
    ("args", "said"),
    [
        ({"kind": "interval", "spec": "60s"}, "missing required field `prompt`"),
        ({"prompt": "p", "kind": "hourly", "spec": "1"}, "at `$.kind`; expected one of cron, interval, once"),
        ({"prompt": "p", "kind": "interval"}, "missing required field `spec`"),
        ({"prompt": "p", "kind": "once", "spec": "2030-01-01T00:00Z", "context_mode": "x"}, "`$.context_mode`"),
        ({"prompt": "p", "kind": "cron", "spec": "* * * * *", "chat_jid": "main@local"}, "may not schedule"),
        ({"prompt": "x" * 10_001, "kind": "interval", "spec": "1h"}, "length <= 10000 - at `$.prompt`"),
    ],
    ids=["no-prompt", "bad-kind", "no-spec", "bad-mode", "other-chat", "long-prompt"],
)
def test_schedule_task_refuses_early_what_it_can_see(tmp_path: Path, args: dict[str, Any], said: str) -> None:
    ctx, emitted = context(tmp_path)
    out = run_tool("schedule_task", args, ctx)
    assert out.is_error and said in out.output
    assert emitted == []


def test_the_main_group_may_schedule_for_a_chat_it_may_post_to(tmp_path: Path) -> None:
    ctx, emitted = context(tmp_path, send_targets=frozenset({"ops@g.us"}))
    run_tool("schedule_task", {"prompt": "p", "kind": "cron", "spec": "0 * * * *", "chat_jid": "ops@g.us"}, ctx)
    assert [e.chat_jid for e in emitted] == ["ops@g.us"]


def test_the_state_changes_and_update_name_a_task_they_were_given(tmp_path: Path) -> None:
    ctx, emitted = context(tmp_path)
    for tool in ("pause_task", "resume_task", "cancel_task"):
        assert not run_tool(tool, {"task_id": "3f2a9c1e"}, ctx).is_error
    assert not run_tool("update_task", {"task_id": "3f2a9c1e", "prompt": "retro"}, ctx).is_error
    assert [(e.action, e.task_id, e.prompt) for e in emitted] == [
        ("pause", "3f2a9c1e", None),
        ("resume", "3f2a9c1e", None),
        ("cancel", "3f2a9c1e", None),
        ("update", "3f2a9c1e", "retro"),
    ]
    unknown = run_tool("cancel_task", {"task_id": "ffff"}, ctx)
    assert unknown.is_error and "no task 'ffff'" in unknown.output
    half = run_tool("update_task", {"task_id": "3f2a9c1e", "kind": "interval"}, ctx)
    assert half.is_error and "together" in half.output
    nothing = run_tool("update_task", {"task_id": "3f2a9c1e"}, ctx)
    assert nothing.is_error and len(emitted) == 4


def test_list_tasks_answers_what_the_run_was_given(tmp_path: Path) -> None:
    ctx, _ = context(tmp_path)
    out = run_tool("list_tasks", {}, ctx)
    assert out.output == (
        "3f2a9c1e-0000-4000-8000-000000000001 [active] cron 0 9 * * 1-5 in team@g.us, "
        "next 2026-12-01T09:00:00+00:00 (made by the agent): standup"
    )
    empty = ToolContext(workspace=tmp_path, limits=Limits())
    assert run_tool("list_tasks", {}, empty).output == "No scheduled tasks (as of the start of this run)."


def test_the_tools_are_not_offered_without_schedules(tmp_path: Path) -> None:
    from agent_runner.tools import disabled_tools

    ctx, emitted = context(tmp_path, disabled=disabled_tools(["send_message", "send_file"]))
    out = run_tool("schedule_task", {"prompt": "p", "kind": "interval", "spec": "1h"}, ctx)
    assert out.is_error and "unknown tool 'schedule_task'" in out.output and emitted == []


def test_the_offline_model_reads_schedule_lines() -> None:
    text = "\n".join(
        [
            "/schedule every 60s: $ echo tick",
            "/schedule cron 0 9 * * 1-5: standup: who is next?",
            "/schedule once 2026-12-01T09:00Z: remind me",
            "/schedule sometimes: no",
            "/tasks",
            "/cancel-task 3f2a",
        ]
    )
    assert tool_requests_in(text) == [
        ("schedule_task", {"prompt": "$ echo tick", "kind": "interval", "spec": "60s"}),
        ("schedule_task", {"prompt": "standup: who is next?", "kind": "cron", "spec": "0 9 * * 1-5"}),
        ("schedule_task", {"prompt": "remind me", "kind": "once", "spec": "2026-12-01T09:00Z"}),
        ("list_tasks", {}),
        ("cancel_task", {"task_id": "3f2a"}),
    ]
