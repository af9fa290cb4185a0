"""The runner's send_file tool: emits the event for a regular workspace file, refuses
early (and never opens) what the host would refuse anyway; the offline ``/send-file``
directive; the in-process MCP tool Claude Code is offered."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path
from typing import Any

import pytest
from runner_harness import RunRunner, in_own_thread, make_input

from agent_runner.claude_code import agent as claude_agent
from agent_runner.protocol import (
    Event,
    Limits,
    ResultEvent,
    SendFileEvent,
    decode_input,
    dump_event,
    parse_event,
)
from agent_runner.providers.offline import tool_requests_in
from agent_runner.tools import REGISTRY, ToolContext, ToolOutcome, run_tool
from agent_runner.tools.send_file import MAX_CAPTION_CHARS, MAX_FILE_BYTES
from fakes.claude_sdk import FakeSdk


def _ctx(workspace: Path, sink: list[Any]) -> ToolContext:
    return ToolContext(workspace=workspace, limits=Limits(), chat_jid="team@g.us", emit=sink.append)


def _send(workspace: Path, path: str, caption: str | None = None) -> tuple[ToolOutcome, list[Any]]:
    sink: list[Any] = []
    args = {"path": path} if caption is None else {"path": path, "caption": caption}
    return run_tool("send_file", args, _ctx(workspace, sink)), sink


def _refused(workspace: Path, path: str) -> str:
    out, sink = _send(workspace, path)
    assert out.is_error and out.exit_code == 1, out
    assert sink == []  # nothing reaches the host
    return out.output


@pytest.fixture
def report(workspace: Path) -> Path:
    path = workspace / "report.txt"
    path.write_text("all good\n")
    return path


# --- what is sent ----------------------------------------------------------------------


def test_a_regular_file_is_sent_with_its_caption(workspace: Path, report: Path) -> None:
    out, sink = _send(workspace, "report.txt", "done")
    assert (out.output, out.exit_code, out.is_error) == ("File sent: report.txt", 0, False)
    assert sink == [SendFileEvent(path="report.txt", caption="done")]


def test_the_path_is_sent_normalized_and_relative(workspace: Path, report: Path) -> None:
    (workspace / "out").mkdir()
    (workspace / "out" / "chart.png").write_bytes(b"\x89PNG")
    for raw, rel in [
        ("./report.txt", "report.txt"),
        (str(report), "report.txt"),
        ("out/../out//chart.png", "out/chart.png"),
        (str(workspace / "out" / "." / "chart.png"), "out/chart.png"),
    ]:
        out, sink = _send(workspace, raw)
        assert out.output == f"File sent: {rel}", raw
        assert sink == [SendFileEvent(path=rel, caption="")], raw


def test_a_workspace_named_through_a_link_takes_absolute_paths_by_that_name(
    workspace: Path, report: Path, tmp_path: Path
) -> None:
    # As in the container if /workspace were a link: the model names what it was told.
    named = tmp_path / "named"
    named.symlink_to(workspace)
    sink: list[Any] = []
    out = run_tool("send_file", {"path": str(named / "report.txt")}, _ctx(named, sink))
    assert out.output == "File sent: report.txt"
    assert sink == [SendFileEvent(path="report.txt")]


def test_an_empty_file_and_one_at_the_bound_are_sent(workspace: Path) -> None:
    (workspace / "empty").touch()
    with open(workspace / "big.bin", "wb") as f:
        f.truncate(MAX_FILE_BYTES)  # sparse: no real bytes
    assert _send(workspace, "empty")[0].exit_code == 0
    assert _send(workspace, "big.bin")[1] == [SendFileEvent(path="big.bin")]


# --- what is refused -----------------------------------------------------------------


def test_paths_outside_the_workspace_are_refused(workspace: Path, tmp_path: Path) -> None:
    (tmp_path / "x").write_text("outside")
    assert _refused(workspace, "../x") == (
        f"send_file: ../x is outside the workspace {workspace.resolve()}; only paths inside it are allowed"
    )
    assert "is outside the workspace" in _refused(workspace, "/etc/passwd")
    assert "is outside the workspace" in _refused(workspace, str(tmp_path / "x"))
    assert "is outside the workspace" in _refused(workspace, "a/../../x")


def test_the_workspace_itself_is_not_a_file(workspace: Path) -> None:
    assert "is the workspace itself" in _refused(workspace, ".")
    assert "is the workspace itself" in _refused(workspace, str(workspace))


def test_a_link_to_a_file_outside_is_refused_not_followed(workspace: Path) -> None:
    (workspace / "passwd").symlink_to("/etc/passwd")
    assert _refused(workspace, "passwd") == (
        "send_file: passwd is a symbolic link; send_file never follows links: name the file itself"
    )


def test_a_link_inside_the_workspace_is_refused_too(workspace: Path, report: Path) -> None:
    (workspace / "alias.txt").symlink_to("report.txt")
    assert "alias.txt is a symbolic link" in _refused(workspace, "alias.txt")
    # A linked folder on the way is a link as well.
    (workspace / "real").mkdir()
    (workspace / "real" / "a.txt").write_text("a")
    (workspace / "linked").symlink_to("real")
    assert "linked is a symbolic link" in _refused(workspace, "linked/a.txt")
    # And a dangling one is a link, not a missing file.
    (workspace / "dangling").symlink_to("nowhere")
    assert "dangling is a symbolic link" in _refused(workspace, "dangling")


@pytest.mark.timeout(10)
def test_a_fifo_is_refused_without_being_opened(workspace: Path) -> None:
    # Opening a FIFO with no writer would block the run: the tool only lstat()s it.
    os.mkfifo(workspace / "pipe")
    assert _refused(workspace, "pipe") == "send_file: pipe is a FIFO (named pipe); only a regular file can be sent"


def test_a_directory_is_refused(workspace: Path) -> None:
    (workspace / "out").mkdir()
    message = _refused(workspace, "out")
    assert message.startswith("send_file: out is a directory") and "archive a folder first" in message
    assert "out is a directory" in _refused(workspace, "out/")


def test_a_file_over_the_bound_is_refused(workspace: Path) -> None:
    with open(workspace / "huge.bin", "wb") as f:
        f.truncate(MAX_FILE_BYTES + 1)  # sparse: the size without the bytes
    assert _refused(workspace, "huge.bin") == (
        f"send_file: huge.bin is {MAX_FILE_BYTES + 1} bytes (25.0 MiB); the limit is {MAX_FILE_BYTES} bytes (25 MiB)"
    )
    assert MAX_FILE_BYTES == 25 * 1024 * 1024


def test_a_missing_file_is_refused(workspace: Path, report: Path) -> None:
    assert _refused(workspace, "nope.txt") == "send_file: nope.txt does not exist in the workspace"
    assert "does not exist" in _refused(workspace, "sub/nope.txt")
    assert _refused(workspace, "report.txt/x") == "send_file: report.txt is not a directory"


def test_bad_input_and_no_run(workspace: Path, report: Path) -> None:
    sink: list[Any] = []
    ctx = _ctx(workspace, sink)
    assert run_tool("send_file", {}, ctx).exit_code == 2
    assert run_tool("send_file", {"path": 5}, ctx).exit_code == 2
    assert run_tool("send_file", {"path": " "}, ctx).exit_code == 2
    assert run_tool("send_file", {"path": "a\x00b"}, ctx).exit_code == 2
    assert run_tool("send_file", {"path": "report.txt", "caption": 3}, ctx).exit_code == 2
    too_long = run_tool("send_file", {"path": "report.txt", "caption": "x" * (MAX_CAPTION_CHARS + 1)}, ctx)
    assert too_long.exit_code == 2 and "length <= 20000 - at `$.caption`" in too_long.output
    no_run = ToolContext(workspace=workspace, limits=Limits(), chat_jid="c")
    assert "outside a run" in run_tool("send_file", {"path": "report.txt"}, no_run).output
    assert sink == []


# --- the event, the offline model, a whole run ------------------------------------------


def test_the_event_round_trips_and_the_offline_directive_parses() -> None:
    event = SendFileEvent(path="out/chart.png", caption="the chart")
    assert parse_event(dump_event(event)) == event
    assert tool_requests_in("/send-file report.txt done\n/send-file out/a.png two words\n/send-file x\n/send-file") == [
        ("send_file", {"path": "report.txt", "caption": "done"}),
        ("send_file", {"path": "out/a.png", "caption": "two words"}),
        ("send_file", {"path": "x"}),
    ]
    # /send and /send-to are not mistaken for it, nor it for them.
    assert tool_requests_in("/send-file a b\n/send a b") == [
        ("send_file", {"path": "a", "caption": "b"}),
        ("send_message", {"text": "a b"}),
    ]


def test_an_offline_run_sends_the_file(run_runner: RunRunner, workspace: Path) -> None:
    (workspace / "report.txt").write_text("the report\n")
    res = run_runner(make_input("/send-file report.txt done"))

    assert res.returncode == 0, res.stderr
    assert res.types == ["tool_use", "send_file", "tool_result", "assistant", "result"]
    for event in res.events:
        parse_event(json.dumps(event))
    use, sent, result = res.events[0], res.of_type("send_file")[0], res.of_type("tool_result")[0]
    assert use["name"] == "send_file" and use["input"] == {"path": "report.txt", "caption": "done"}
    assert parse_event(json.dumps(sent)) == SendFileEvent(path="report.txt", caption="done")
    assert (result["output"], result["exit_code"], result["is_error"]) == ("File sent: report.txt", 0, False)
    assert "Ran `send_file report.txt` (exit 0)" in res.of_type("assistant")[0]["text"]


def test_an_offline_run_reports_a_refusal_and_sends_nothing(run_runner: RunRunner, workspace: Path) -> None:
    (workspace / "secret").symlink_to("/etc/passwd")
    res = run_runner(make_input("/send-file secret"))

    assert res.returncode == 0, res.stderr
    assert res.of_type("send_file") == []
    (result,) = res.of_type("tool_result")
    assert result["is_error"] and "secret is a symbolic link" in result["output"]


# --- Claude Code: the in-process MCP tool ----------------------------------------------
#
# The SDK is only in the claude-code image variant; fakes/claude_sdk.py stands in, its
# client playing the CLI calling our MCP tools.

# The model's calls, as the CLI makes them: by the MCP server's tools; the last one's arguments
# do not decode (the same Struct and refusal as in our own loop).
CALLS = [
    ("send_file", {"path": "report.txt", "caption": "weekly"}),
    ("send_file", {"path": "../etc/passwd"}),
    ("send_message", {"text": "sent it"}),
    ("send_message", {"text": ["sent it"]}),
]


def test_claude_code_is_offered_send_file_next_to_send_message(
    monkeypatch: pytest.MonkeyPatch, workspace: Path, tmp_path: Path
) -> None:
    (workspace / "report.txt").write_text("the report\n")
    sdk = FakeSdk(CALLS)
    monkeypatch.setitem(sys.modules, "claude_agent_sdk", sdk)
    inp = decode_input(
        json.dumps(
            make_input(
                "send the report",
                chat_jid="team@g.us",
                model={"provider": "claude-code", "model": "claude-sonnet-4-5", "base_url": "http://127.0.0.1:9"},
            )
        )
    )
    (tmp_path / "session").mkdir()
    events: list[Event] = []
    in_own_thread(
        claude_agent.run_claude_code, inp, events.append, workspace=workspace, session_root=tmp_path / "session"
    )

    server = sdk.options.mcp_servers[claude_agent.MCP_SERVER]
    assert claude_agent.MCP_SERVER == "chat"  # the CLI names them mcp__chat__send_message, mcp__chat__send_file
    offered = {t.name: t for t in server["tools"]}
    assert list(offered)[:2] == ["send_message", "send_file"]
    for name, tool in offered.items():  # the registry's own spec, not a copy
        spec = REGISTRY[name].spec
        assert (tool.description, tool.input_schema) == (spec.description, spec.input_schema)
    assert not {"mcp__chat__send_message", "mcp__chat__send_file"} & set(sdk.options.disallowed_tools)

    assert sdk.replies == [
        {"content": [{"type": "text", "text": "File sent: report.txt"}], "is_error": False},
        {
            "content": [
                {
                    "type": "text",
                    "text": f"send_file: ../etc/passwd is outside the workspace {workspace.resolve()};"
                    " only paths inside it are allowed",
                }
            ],
            "is_error": True,
        },
        {"content": [{"type": "text", "text": "Message sent to team@g.us."}], "is_error": False},
        {
            "content": [{"type": "text", "text": "send_message: Expected `str`, got `array` - at `$.text`"}],
            "is_error": True,
        },
    ]
    sent = [e for e in events if isinstance(e, SendFileEvent)]
    assert sent == [SendFileEvent(path="report.txt", caption="weekly")]
    assert isinstance(events[-1], ResultEvent)
