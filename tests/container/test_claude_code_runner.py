"""The claude-code provider's own parts, without the SDK: the message mapping,
the prompt, and the loopback relay to the gateway's socket.

The SDK's messages are read by their class names and fields; the stand-ins
below have exactly those (the real SDK runs in
tests/integration/test_claude_code_sandbox.py).
"""

from __future__ import annotations

import os
import socket
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from agent_runner.claude_code.mapping import EventMapper, read_snapshot, tool_result_text
from agent_runner.claude_code.prompt import build_prompt, session_file, since_last_answer
from agent_runner.errors import ProviderError
from agent_runner.protocol import (
    AssistantEvent,
    Event,
    ResultEvent,
    SdkMessage,
    TextDeltaEvent,
    ThinkingEvent,
    ToolResultEvent,
    ToolUseEvent,
)
from agent_runner.relay import UnixRelay
from fakes.claude_sdk import ResultMessage

# -- the SDK's shapes (claude_agent_sdk.types) -----------------------------------


@dataclass
class TextBlock:
    text: str


@dataclass
class ThinkingBlock:
    thinking: str
    signature: str = "sig"


@dataclass
class ToolUseBlock:
    id: str
    name: str
    input: dict[str, Any]


@dataclass
class ToolResultBlock:
    tool_use_id: str
    content: Any = None
    is_error: bool | None = None


@dataclass
class AssistantMessage:
    content: list[Any]
    model: str = "m"
    parent_tool_use_id: str | None = None
    error: str | None = None


@dataclass
class UserMessage:
    content: Any
    parent_tool_use_id: str | None = None


@dataclass
class StreamEvent:
    event: dict[str, Any]
    uuid: str = "u"
    session_id: str = "sess-1"
    parent_tool_use_id: str | None = None


def _mapper(tmp_path: Path) -> tuple[EventMapper, list[Event]]:
    events: list[Event] = []
    return EventMapper(emit=events.append, workspace=tmp_path), events


def _call(mapper: EventMapper, tool_id: str, name: str, tool_input: dict[str, Any]) -> None:
    mapper.feed(AssistantMessage([ToolUseBlock(tool_id, name, tool_input)]))


def _result(
    mapper: EventMapper, events: list[Event], tool_id: str, content: Any = "ok", is_error: bool = False
) -> ToolResultEvent:
    mapper.feed(UserMessage([ToolResultBlock(tool_id, content, is_error)]))
    event = events[-1]
    assert isinstance(event, ToolResultEvent)
    return event


# -- mapping ------------------------------------------------------------------------


def test_text_thinking_and_tool_use_become_events(tmp_path: Path) -> None:
    mapper, events = _mapper(tmp_path)
    mapper.feed(
        AssistantMessage(
            [
                ThinkingBlock("let me see"),
                TextBlock("hello"),
                TextBlock("  "),
                ToolUseBlock("t1", "Bash", {"command": "ls"}),
            ]
        )
    )
    assert events == [
        ThinkingEvent(text="let me see"),
        AssistantEvent(text="hello"),
        ToolUseEvent(id="t1", name="Bash", input={"command": "ls"}),
    ]


def test_a_write_is_a_code_edit_of_the_file_before_and_after(tmp_path: Path) -> None:
    mapper, events = _mapper(tmp_path)
    tool_input = {"file_path": str(tmp_path / "src" / "app.py"), "content": "print(1)\n"}
    _call(mapper, "w1", "Write", tool_input)
    mapper.snapshot_before("w1", "Write", tool_input)  # the pre-tool hook: nothing there yet
    (tmp_path / "src").mkdir()
    (tmp_path / "src" / "app.py").write_text("print(1)\n")
    event = _result(mapper, events, "w1", "File created")
    assert event.envelope is not None and event.envelope["message_type"] == "CODE_EDIT"
    (edit,) = event.envelope["payload"]["edits"]
    assert edit == {"file_path": "src/app.py", "old_content": None, "new_content": "print(1)\n", "language": "python"}


def test_an_edit_keeps_the_old_text_and_a_failed_edit_is_a_tool_call(tmp_path: Path) -> None:
    mapper, events = _mapper(tmp_path)
    notes = tmp_path / "notes.md"
    notes.write_text("draft\n")
    tool_input = {"file_path": str(notes), "old_string": "draft", "new_string": "final"}
    _call(mapper, "e1", "Edit", tool_input)
    mapper.snapshot_before("e1", "Edit", tool_input)
    notes.write_text("final\n")
    ok = _result(mapper, events, "e1")
    assert ok.envelope is not None
    assert ok.envelope["payload"]["edits"][0]["old_content"] == "draft\n"
    assert ok.envelope["payload"]["edits"][0]["new_content"] == "final\n"

    _call(mapper, "e2", "Edit", tool_input)
    mapper.snapshot_before("e2", "Edit", tool_input)
    failed = _result(mapper, events, "e2", "String to replace not found", is_error=True)
    assert failed.is_error and failed.exit_code == 1
    assert failed.envelope is not None and failed.envelope["message_type"] == "TOOL_CALL"
    assert failed.envelope["payload"]["error"] == "String to replace not found"
    assert not mapper.before  # every snapshot is used up


def test_todo_write_is_a_todo_list_and_other_tools_are_tool_calls(tmp_path: Path) -> None:
    mapper, events = _mapper(tmp_path)
    todos = [
        {"content": "a", "status": "completed", "activeForm": "A"},
        {"content": "b", "status": "in_progress", "activeForm": "B"},
    ]
    _call(mapper, "td", "TodoWrite", {"todos": todos})
    todo = _result(mapper, events, "td", "Todos have been modified")
    assert todo.envelope is not None and todo.envelope["message_type"] == "TODO"
    assert todo.envelope["payload"]["todos"] == [
        {"id": "1", "content": "a", "status": "completed"},
        {"id": "2", "content": "b", "status": "in_progress"},
    ]
    # A list the TODO envelope cannot hold (an unknown status) is still recorded, as a call.
    _call(mapper, "td2", "TodoWrite", {"todos": [{"content": "x", "status": "someday"}]})
    assert _result(mapper, events, "td2").envelope["message_type"] == "TOOL_CALL"  # type: ignore[index]
    _call(mapper, "b1", "Bash", {"command": "echo hi"})
    bash = _result(mapper, events, "b1", [{"type": "text", "text": "hi"}, {"type": "image"}])
    assert bash.output == "hi\n[image]" and bash.name == "Bash" and bash.exit_code == 0
    # A huge result (the CLI's, or a file it read) is capped like our own tools' output.
    _call(mapper, "b2", "Bash", {"command": "yes | head -c 1000000"})
    huge = _result(mapper, events, "b2", "y\n" * 500_000)
    assert len(huge.output.encode()) < mapper.output_cap + 200 and "truncated" in huge.output
    assert bash.envelope is not None and bash.envelope["payload"]["tool_name"] == "Bash"


def test_streamed_text_goes_out_as_deltas_before_the_whole_reply(tmp_path: Path) -> None:
    from agent_runner.text_stream import DeltaCoalescer

    events: list[Event] = []
    mapper = EventMapper(
        emit=events.append, workspace=tmp_path, deltas=DeltaCoalescer(events.append, min_interval_s=0.0)
    )
    mapper.feed(StreamEvent({"type": "message_start", "message": {}}))
    mapper.feed(StreamEvent({"type": "content_block_start", "index": 0, "content_block": {"type": "text"}}))
    for piece in ("Hel", "lo"):
        mapper.feed(
            StreamEvent({"type": "content_block_delta", "index": 0, "delta": {"type": "text_delta", "text": piece}})
        )
    mapper.feed(
        StreamEvent(
            {"type": "content_block_delta", "index": 1, "delta": {"type": "input_json_delta", "partial_json": "{"}}
        )
    )
    mapper.feed(
        StreamEvent(
            {"type": "content_block_delta", "index": 0, "delta": {"type": "text_delta", "text": "!"}},
            parent_tool_use_id="task",
        )
    )
    mapper.feed(StreamEvent({"type": "message_stop"}))
    mapper.feed(AssistantMessage([TextBlock("Hello")]))
    assert events == [
        TextDeltaEvent(block="1.0", text="Hel"),
        TextDeltaEvent(block="1.0", text="lo"),
        AssistantEvent(text="Hello"),
    ]
    # Without a sink (not streamed) the stream events are ignored.
    plain, quiet = _mapper(tmp_path)
    plain.feed(StreamEvent({"type": "content_block_delta", "index": 0, "delta": {"type": "text_delta", "text": "x"}}))
    assert quiet == []


def test_a_subagents_inner_turns_are_not_the_chats(tmp_path: Path) -> None:
    mapper, events = _mapper(tmp_path)
    mapper.feed(AssistantMessage([TextBlock("inner")], parent_tool_use_id="task-1"))
    mapper.feed(UserMessage([ToolResultBlock("x", "inner result")], parent_tool_use_id="task-1"))
    mapper.feed(UserMessage("the prompt, echoed"))
    assert events == []


def test_the_result_counts_every_prompt_token_and_names_the_limit(tmp_path: Path) -> None:
    mapper, _ = _mapper(tmp_path)
    mapper.feed(
        ResultMessage(
            usage={
                "input_tokens": 5,
                "output_tokens": 7,
                "cache_read_input_tokens": 100,
                "cache_creation_input_tokens": 20,
            },
            num_turns=3,
        )
    )
    assert mapper.result == ResultEvent(
        usage=mapper.result.usage if mapper.result else None,  # type: ignore[arg-type]
        session_id="sess-1",
        stop_reason="end_turn",
        num_turns=3,
    )
    assert mapper.result is not None
    usage = mapper.result.usage
    assert (
        usage.input_tokens,
        usage.output_tokens,
        usage.cache_read_input_tokens,
        usage.cache_creation_input_tokens,
    ) == (125, 7, 100, 20)
    mapper.feed(ResultMessage(subtype="error_max_turns", is_error=True, stop_reason=None))
    assert mapper.result.stop_reason == "max_turns"


def test_failures_are_provider_errors_retryable_only_when_a_retry_may_help(tmp_path: Path) -> None:
    mapper, _ = _mapper(tmp_path)
    with pytest.raises(ProviderError) as bad:
        mapper.feed(ResultMessage(subtype="error_during_execution", is_error=True, result="boom"))
    assert not bad.value.retryable and "boom" in str(bad.value)
    with pytest.raises(ProviderError) as limited:
        mapper.feed(AssistantMessage([TextBlock("API Error: 429")], error="rate_limit"))
    assert limited.value.retryable
    with pytest.raises(ProviderError) as denied:
        mapper.feed(AssistantMessage([TextBlock("Invalid API key")], error="authentication_failed"))
    assert not denied.value.retryable


def test_snapshots_are_bounded_and_never_block(tmp_path: Path) -> None:
    fifo = tmp_path / "pipe"
    os.mkfifo(fifo)
    started = time.monotonic()
    assert read_snapshot(fifo).text is None  # a writer that never comes must not hang the run
    assert time.monotonic() - started < 5
    assert read_snapshot(tmp_path / "missing").text is None
    big = tmp_path / "big.txt"
    big.write_bytes(b"x" * 300_000)
    snap = read_snapshot(big)
    assert snap.size == 300_000 and snap.text is not None and len(snap.text) == 64 * 1024
    assert tool_result_text(None) == "" and tool_result_text("plain") == "plain"


# -- prompt -------------------------------------------------------------------------


def _m(role: str, content: str, sender: str | None = None) -> SdkMessage:
    return SdkMessage(role=role, content=content, sender_name=sender)  # type: ignore[arg-type]


def test_a_resumed_session_is_sent_only_what_is_new() -> None:
    history = [
        _m("user", "first", "Ann"),
        _m("assistant", "answer"),
        _m("tool_result", "out"),
        _m("user", "second", "Bob"),
        _m("user", "third", "Ann"),
    ]
    assert [m.content for m in since_last_answer(history)] == ["second", "third"]
    resumed = build_prompt(history, "Andy", resuming=True)
    assert "first" not in resumed and "Bob: second" in resumed and "Ann: third" in resumed
    fresh = build_prompt(history, "Andy", resuming=False)
    assert fresh.index("Ann: first") < fresh.index("Andy (you): answer") < fresh.index("New since")
    assert fresh.index("New since") < fresh.index("Bob: second")
    only_new = build_prompt([_m("user", "hi", "Ann")], "Andy", resuming=False)
    assert only_new == "Ann: hi"


def test_a_session_file_is_looked_up_by_a_plain_id_only(tmp_path: Path) -> None:
    project = tmp_path / "projects" / "-workspace"
    project.mkdir(parents=True)
    (project / "abc-123.jsonl").write_text("{}\n")
    assert session_file(tmp_path, "abc-123") == project / "abc-123.jsonl"
    assert session_file(tmp_path, "nope") is None
    for hostile in ("../abc-123", "*", ".hidden", ""):
        assert session_file(tmp_path, hostile) is None, hostile


# -- relay --------------------------------------------------------------------------


def _echo_server(path: Path) -> socket.socket:
    server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    server.bind(str(path))
    server.listen()

    def serve() -> None:
        while True:
            try:
                conn, _ = server.accept()
            except OSError:
                return

            def echo(c: socket.socket) -> None:
                with c:
                    while data := c.recv(65536):
                        c.sendall(data)

            threading.Thread(target=echo, args=(conn,), daemon=True).start()

    threading.Thread(target=serve, daemon=True).start()
    return server


def test_the_relay_carries_both_ways_on_loopback_only(tmp_path: Path) -> None:
    server = _echo_server(tmp_path / "gw.sock")
    try:
        with UnixRelay(str(tmp_path / "gw.sock")) as relay:
            assert relay.base_url == f"http://127.0.0.1:{relay.port}"
            payload = os.urandom(1_500_000)
            with socket.create_connection(("127.0.0.1", relay.port), timeout=10) as client:

                def send() -> None:
                    client.sendall(payload)
                    client.shutdown(socket.SHUT_WR)

                sender = threading.Thread(target=send)
                sender.start()
                got = bytearray()
                while data := client.recv(65536):
                    got += data
                sender.join()
            assert bytes(got) == payload
    finally:
        server.close()


def test_the_relay_closes_a_connection_it_cannot_carry(tmp_path: Path) -> None:
    with UnixRelay(str(tmp_path / "absent.sock")) as relay:
        with socket.create_connection(("127.0.0.1", relay.port), timeout=10) as client:
            client.sendall(b"POST /v1/messages HTTP/1.1\r\n\r\n")
            try:
                assert client.recv(100) == b""  # closed, nothing answered
            except ConnectionResetError:
                pass  # closed with our bytes unread: the same for the CLI
