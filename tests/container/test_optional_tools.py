"""The optional tools (``protocol.OPTIONAL_TOOLS``): a run is offered those its group's profile
enables (``ContainerInput.tools``; unset: all), by our own loop and by Claude Code's MCP
server alike, and a call to another is refused like an unknown tool.  The host refuses their
events again (tests/host/test_group_profile.py); this is the runner's side."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import msgspec
import pytest
from runner_harness import RunRunner, in_own_thread, make_input

from agent_runner.claude_code import agent as claude_agent
from agent_runner.loop import run_agent
from agent_runner.protocol import (
    OPTIONAL_TOOL_NAMES,
    OPTIONAL_TOOLS,
    ContainerInput,
    Event,
    Limits,
    QuestionEvent,
    ResultEvent,
    SendMessageEvent,
    ToolResultEvent,
    decode_input,
)
from agent_runner.providers.base import (
    ProviderMessage,
    ProviderResponse,
    TextBlock,
    TextSink,
    TokenUsage,
    ToolSpec,
    ToolUseBlock,
)
from agent_runner.tools import REGISTRY, ToolContext, disabled_tools, run_tool, tool_specs
from fakes.claude_sdk import FakeSdk


def _input(**fields: Any) -> ContainerInput:
    return decode_input(json.dumps(make_input("go", chat_jid="team@g.us", **fields)))


def test_the_optional_tools_are_tools_of_the_registry() -> None:
    assert OPTIONAL_TOOLS == ("send_message", "send_file", "schedules", "questions", "message_changes")
    assert tuple(OPTIONAL_TOOL_NAMES) == OPTIONAL_TOOLS
    every = {name for names in OPTIONAL_TOOL_NAMES.values() for name in names}
    assert every <= set(REGISTRY)
    assert disabled_tools(msgspec.UNSET) == frozenset()
    assert disabled_tools([]) == frozenset(every)
    assert disabled_tools(["send_file", "schedules", "questions", "message_changes"]) == {"send_message"}
    assert disabled_tools(["send_file", "send_message", "questions", "message_changes"]) == set(
        OPTIONAL_TOOL_NAMES["schedules"]
    )
    assert disabled_tools(["send_file", "send_message", "schedules", "message_changes"]) == {"ask_user"}
    # Unset, the field is left out of the input; set, it is there.
    assert b'"tools"' not in _input().to_json()
    assert _input(tools=["send_file"]).tools == ["send_file"]


class CallsEveryTool:
    """A model that calls send_message whatever it is offered, then answers; keeps what it was offered."""

    def __init__(self) -> None:
        self.offered: list[list[str]] = []
        self.turn = 0

    def complete(
        self, system: str, messages: list[ProviderMessage], tools: list[ToolSpec], on_text: TextSink | None = None
    ) -> ProviderResponse:
        self.offered.append([t.name for t in tools])
        self.turn += 1
        if self.turn == 1:
            call = ToolUseBlock("t1", "send_message", {"text": "hello"})
            return ProviderResponse([call], "tool_use", TokenUsage(3, 2))
        return ProviderResponse([TextBlock("done")], "end_turn", TokenUsage(3, 1))


def test_the_loop_offers_only_the_enabled_tools_and_refuses_the_others(tmp_path: Path) -> None:
    model = CallsEveryTool()
    events: list[Event] = []
    run_agent(_input(tools=["send_file"]), model, events.append, workspace=tmp_path)
    offered = model.offered[0]
    assert "send_message" not in offered and "send_file" in offered and "bash" in offered
    assert not [e for e in events if isinstance(e, SendMessageEvent)]
    (result,) = [e for e in events if isinstance(e, ToolResultEvent)]
    assert result.is_error and result.exit_code == 127  # as an unknown tool
    assert result.output.startswith("unknown tool 'send_message'; available: ")
    assert "send_file" in result.output and "send_message" not in result.output.split("available: ")[1]

    # Unset: every tool, and the call goes through.
    everything = CallsEveryTool()
    events = []
    run_agent(_input(), everything, events.append, workspace=tmp_path)
    assert everything.offered[0] == [spec.name for spec in tool_specs()]
    assert [e for e in events if isinstance(e, SendMessageEvent)] == [
        SendMessageEvent(chat_jid="team@g.us", text="hello")
    ]


def test_run_tool_refuses_a_disabled_tool_like_an_unknown_one(tmp_path: Path) -> None:
    sink: list[Any] = []
    ctx = ToolContext(
        workspace=tmp_path, limits=Limits(), chat_jid="c@g", emit=sink.append, disabled=frozenset({"send_message"})
    )
    refused = run_tool("send_message", {"text": "x"}, ctx)
    unknown = run_tool("teleport", {}, ctx)
    assert (refused.exit_code, refused.is_error) == (unknown.exit_code, unknown.is_error) == (127, True)
    assert sink == []
    assert [s.name for s in tool_specs(ctx.disabled)] == [n for n in REGISTRY if n != "send_message"]


def test_an_offline_run_without_send_message_posts_nothing(run_runner: RunRunner) -> None:
    # The offline model asks only for the tools it is offered: "/send" becomes no call at all.
    res = run_runner(make_input("/send hello there", tools=["send_file"]))
    assert res.returncode == 0, res.stderr
    assert res.of_type("send_message") == [] and res.of_type("tool_use") == []
    allowed = run_runner(make_input("/send hello there"))
    assert [e["text"] for e in allowed.of_type("send_message")] == ["hello there"]


# --- Claude Code's MCP server ---------------------------------------------------------
#
# The SDK is only in the claude-code image variant; fakes/claude_sdk.py stands in.


def _claude_code(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, calls: dict[str, dict[str, Any]] | None = None, **fields: Any
) -> tuple[FakeSdk, list[Event]]:
    sdk = FakeSdk(list((calls or {"send_message": {"text": "from claude"}}).items()))
    monkeypatch.setitem(sys.modules, "claude_agent_sdk", sdk)
    model = {"provider": "claude-code", "model": "claude-sonnet-4-5", "base_url": "http://127.0.0.1:9"}
    inp = _input(model=model, **fields)
    workspace, session = tmp_path / "workspace", tmp_path / "session"
    workspace.mkdir(exist_ok=True)
    session.mkdir(exist_ok=True)
    events: list[Event] = []
    in_own_thread(claude_agent.run_claude_code, inp, events.append, workspace=workspace, session_root=session)
    assert isinstance(events[-1], ResultEvent)
    return sdk, events


def test_claude_codes_mcp_server_offers_only_the_enabled_tools(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    sdk, events = _claude_code(monkeypatch, tmp_path, tools=["send_file"])
    ((name, tools),) = sdk.servers
    assert name == claude_agent.MCP_SERVER and [t.name for t in tools] == ["send_file"]
    assert sdk.replies == [] and not [e for e in events if isinstance(e, SendMessageEvent)]

    sdk, events = _claude_code(monkeypatch, tmp_path)  # unset: all of them
    ((_, tools),) = sdk.servers
    assert [t.name for t in tools] == [
        "send_message",
        "send_file",
        *OPTIONAL_TOOL_NAMES["schedules"],
        "ask_user",
        "edit_message",
        "add_reaction",
    ]
    assert sdk.replies == [{"content": [{"type": "text", "text": "Message sent to team@g.us."}], "is_error": False}]
    assert [e for e in events if isinstance(e, SendMessageEvent)] == [
        SendMessageEvent(chat_jid="team@g.us", text="from claude")
    ]

    sdk, _ = _claude_code(monkeypatch, tmp_path, tools=[])  # none: no server at all
    assert sdk.servers == [] and sdk.options.mcp_servers == {}


def test_claude_codes_ask_user_posts_the_question_and_says_the_answer_comes_next(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    sdk, events = _claude_code(
        monkeypatch, tmp_path, calls={"ask_user": {"question": "Ship it?", "options": ["yes", "no"]}}
    )
    (reply,) = sdk.replies
    assert reply["is_error"] is False and "the answer will come as the next message" in reply["content"][0]["text"]
    assert [e for e in events if isinstance(e, QuestionEvent)] == [
        QuestionEvent(tool_use_id="", question="Ship it?", options=["yes", "no"])
    ]
    # The CLI's own question tool waits in the run for nobody: it is not offered.
    assert "AskUserQuestion" in sdk.options.disallowed_tools
