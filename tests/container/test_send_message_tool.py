"""The runner's send_message tool: emits the event for allowed chats, refuses the rest early."""

from __future__ import annotations

from pathlib import Path

from agent_runner.protocol import Limits, SendMessageEvent, dump_event, parse_event
from agent_runner.providers.offline import tool_requests_in
from agent_runner.tools import ToolContext, run_tool


def _ctx(tmp_path: Path, sink: list, targets: frozenset[str] = frozenset()) -> ToolContext:
    return ToolContext(
        workspace=tmp_path, limits=Limits(), chat_jid="team@g.us", send_targets=targets, emit=sink.append
    )


def test_own_chat_by_default(tmp_path: Path) -> None:
    sink: list = []
    out = run_tool("send_message", {"text": "on it"}, _ctx(tmp_path, sink))
    assert (out.output, out.exit_code, out.is_error) == ("Message sent to team@g.us.", 0, False)
    assert sink == [SendMessageEvent(chat_jid="team@g.us", text="on it")]


def test_targets_named_by_the_host_are_allowed_others_refused(tmp_path: Path) -> None:
    sink: list = []
    ctx = _ctx(tmp_path, sink, frozenset({"ops@g.us"}))
    assert run_tool("send_message", {"text": "hi", "chat_jid": "ops@g.us"}, ctx).exit_code == 0
    refused = run_tool("send_message", {"text": "hi", "chat_jid": "other@g.us"}, ctx)
    assert refused.is_error and refused.exit_code == 1
    assert "may not post to 'other@g.us'" in refused.output
    assert sink == [SendMessageEvent(chat_jid="ops@g.us", text="hi")]


def test_bad_input_and_no_run(tmp_path: Path) -> None:
    sink: list = []
    assert run_tool("send_message", {}, _ctx(tmp_path, sink)).exit_code == 2
    assert run_tool("send_message", {"text": 5}, _ctx(tmp_path, sink)).exit_code == 2
    assert run_tool("send_message", {"text": "x" * 20_001}, _ctx(tmp_path, sink)).is_error
    no_run = ToolContext(workspace=tmp_path, limits=Limits(), chat_jid="c")
    assert "outside a run" in run_tool("send_message", {"text": "x"}, no_run).output
    assert sink == []


def test_event_round_trips_and_offline_directives() -> None:
    line = dump_event(SendMessageEvent(chat_jid="a@b", text="t"))
    assert parse_event(line) == SendMessageEvent(chat_jid="a@b", text="t")
    assert tool_requests_in("/send hello there\n/send-to ops@g.us deployed\n/send-to nospace") == [
        ("send_message", {"text": "hello there"}),
        ("send_message", {"chat_jid": "ops@g.us", "text": "deployed"}),
    ]
