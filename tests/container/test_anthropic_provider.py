"""AnthropicProvider against a fake Messages API speaking the real wire format.

The fake server runs on loopback (or a unix socket, as the host gateway
does) and plays a scripted conversation; the real SDK, provider and agent
loop talk to it, and the tests check both what the runner emitted and what
the server received.
"""

from __future__ import annotations

import json
import tempfile
from pathlib import Path
from typing import Any

import pytest
from runner_harness import RunRunner, make_input

from agent_runner.errors import InputError, ProviderError
from agent_runner.loop import run_agent
from agent_runner.one_run import run
from agent_runner.protocol import (
    AssistantEvent,
    ErrorEvent,
    Event,
    ModelSettings,
    ResultEvent,
    TextDeltaEvent,
    ToolResultEvent,
    ToolUseEvent,
    decode_input,
)
from agent_runner.providers.anthropic import AnthropicProvider
from agent_runner.providers.base import ProviderMessage, TextBlock
from agent_runner.tools import tool_specs
from fakes.anthropic_api import (
    FakeAnthropic,
    UnixHTTPServer,
    _serve,
    api_error,
    message,
    sent_key,
    serve_tcp,
)

__all__ = ["serve_tcp"]  # a fixture, used by name


def settings(base_url: str | None = None, socket_path: str | None = None) -> ModelSettings:
    return ModelSettings(
        provider="anthropic",
        model="claude-fake",
        max_tokens=321,
        base_url=base_url,
        socket_path=socket_path,
    )


def tool_then_text() -> FakeAnthropic:
    return FakeAnthropic(
        message(
            [
                {"type": "text", "text": "Let me check."},
                {
                    "type": "tool_use",
                    "id": "toolu_01",
                    "name": "bash",
                    "input": {"command": "echo from-fake"},
                },
            ],
            "tool_use",
            n=1,
        ),
        message([{"type": "text", "text": "The command printed from-fake."}], "end_turn", n=2),
    )


def run_with(provider: AnthropicProvider, workspace: Path, **fields: Any) -> list[Event]:
    events: list[Event] = []
    inp = decode_input(json.dumps(make_input("run echo please", **fields)))

    def keep(event: Event) -> None:
        if not isinstance(event, TextDeltaEvent):  # the streamed text: test_streaming.py
            events.append(event)

    run_agent(inp, provider, keep, workspace=workspace)
    return events


def assert_tool_conversation(events: list[Event], fake: FakeAnthropic) -> None:
    assert [e.type for e in events] == [
        "assistant",
        "tool_use",
        "tool_result",
        "assistant",
        "result",
    ]
    tool_use, tool_result, final = events[1], events[2], events[4]
    assert isinstance(tool_use, ToolUseEvent) and tool_use.id == "toolu_01"
    assert tool_use.input == {"command": "echo from-fake"}
    assert isinstance(tool_result, ToolResultEvent) and tool_result.exit_code == 0
    assert tool_result.output == "from-fake\n"
    assert isinstance(final, ResultEvent) and final.num_turns == 2
    assert final.stop_reason == "end_turn"
    assert final.usage.input_tokens == 30 and final.usage.output_tokens == 3

    # What the server received on the second call: the assistant turn, then the result.
    assert len(fake.requests) == 2
    sent = fake.requests[1]["messages"]
    assert [m["role"] for m in sent] == ["user", "assistant", "user"]
    assert sent[1]["content"][1] == {
        "type": "tool_use",
        "id": "toolu_01",
        "name": "bash",
        "input": {"command": "echo from-fake"},
    }
    (result_block,) = sent[2]["content"]
    assert result_block["type"] == "tool_result" and result_block["tool_use_id"] == "toolu_01"
    assert "from-fake" in result_block["content"] and "exit_code=0" in result_block["content"]
    assert result_block["is_error"] is False


def test_tool_use_round_trip_over_http(serve_tcp: Any, workspace: Path) -> None:
    fake = tool_then_text()
    events = run_with(AnthropicProvider(settings(base_url=serve_tcp(fake))), workspace)
    assert_tool_conversation(events, fake)


def test_request_carries_tools_system_prompt_and_placeholder_key(serve_tcp: Any, workspace: Path) -> None:
    fake = FakeAnthropic(message([{"type": "text", "text": "hi"}], "end_turn"))
    provider = AnthropicProvider(settings(base_url=serve_tcp(fake)))
    run_with(provider, workspace, assistant_name="Bob", system_notices=["Reply in French today."])

    (request,) = fake.requests
    assert request["model"] == "claude-fake" and request["max_tokens"] == 321
    # Prompt-cache breakpoints on the tools, the system prompt and the end of the messages.
    ephemeral = {"type": "ephemeral"}
    (system,) = request["system"]
    assert "You are Bob" in system["text"] and "Reply in French today." in system["text"]
    assert system["cache_control"] == ephemeral
    assert request["messages"] == [
        {"role": "user", "content": [{"type": "text", "text": "run echo please", "cache_control": ephemeral}]}
    ]
    specs = tool_specs()
    assert request["tools"] == [
        {"name": spec.name, "description": spec.description, "input_schema": spec.input_schema}
        | ({"cache_control": ephemeral} if spec is specs[-1] else {})
        for spec in specs
    ]
    assert [t["name"] for t in request["tools"]] == [
        "bash",
        "read_file",
        "write_file",
        "edit_file",
        "glob",
        "grep",
        "todo_write",
        "send_message",
        "send_file",
        "schedule_task",
        "list_tasks",
        "update_task",
        "pause_task",
        "resume_task",
        "cancel_task",
        "ask_user",
        "edit_message",
        "add_reaction",
    ]
    assert sent_key(fake.headers[0]) == "via-gateway"


def test_server_error_is_retried(serve_tcp: Any, workspace: Path) -> None:
    fake = FakeAnthropic(
        api_error(500, "api_error", "transient"),
        message([{"type": "text", "text": "recovered"}], "end_turn"),
    )
    events = run_with(AnthropicProvider(settings(base_url=serve_tcp(fake))), workspace)

    assert len(fake.requests) == 2
    assert [e.type for e in events] == ["assistant", "result"]
    assert events[0] == AssistantEvent(text="recovered")


def test_rate_limit_is_retried(serve_tcp: Any, workspace: Path) -> None:
    fake = FakeAnthropic(
        api_error(429, "rate_limit_error", "slow down"),
        message([{"type": "text", "text": "after the wait"}], "end_turn"),
    )
    events = run_with(AnthropicProvider(settings(base_url=serve_tcp(fake))), workspace)
    assert len(fake.requests) == 2 and events[0] == AssistantEvent(text="after the wait")


@pytest.mark.parametrize("body", [b"<html>502 bad gateway</html>", b'{"type": "message", "content": "oops"'])
def test_a_malformed_response_is_a_clear_provider_error(serve_tcp: Any, body: bytes) -> None:
    fake = FakeAnthropic(*[(200, body, {})] * 3)
    provider = AnthropicProvider(settings(base_url=serve_tcp(fake)))
    with pytest.raises(ProviderError) as caught:
        provider.complete("sys", [ProviderMessage("user", [TextBlock("hi")])], [])
    assert "malformed response from the Anthropic API" in str(caught.value)
    assert not caught.value.retryable


def test_persistent_overload_is_a_retryable_provider_error(serve_tcp: Any) -> None:
    fake = FakeAnthropic(*[api_error(529, "overloaded_error", "busy")] * 3)
    provider = AnthropicProvider(settings(base_url=serve_tcp(fake)))
    with pytest.raises(ProviderError) as caught:
        provider.complete("sys", [ProviderMessage("user", [TextBlock("hi")])], [])

    assert caught.value.retryable and caught.value.status_code == 529
    assert len(fake.requests) == 3  # the first try and max_retries=2


def test_bad_request_is_not_retried(serve_tcp: Any) -> None:
    fake = FakeAnthropic(api_error(400, "invalid_request_error", "max_tokens: too large"))
    provider = AnthropicProvider(settings(base_url=serve_tcp(fake)))
    with pytest.raises(ProviderError) as caught:
        provider.complete("sys", [ProviderMessage("user", [TextBlock("hi")])], [])

    assert not caught.value.retryable and caught.value.status_code == 400
    assert "max_tokens: too large" in str(caught.value)
    assert len(fake.requests) == 1


def test_bad_request_becomes_an_error_event_and_exit_1(serve_tcp: Any, workspace: Path) -> None:
    # __main__.run is the process minus stdin/stdout (the SDK import is slow
    # enough that one subprocess test below is plenty).
    fake = FakeAnthropic(api_error(400, "invalid_request_error", "model: unknown"))
    doc = make_input("hi", model=json.loads(settings(base_url=serve_tcp(fake)).to_json()))
    events: list[Event] = []
    code = run(json.dumps(doc).encode(), events.append, workspace)

    assert code == 1
    assert [e.type for e in events] == ["error"]
    error = events[0]
    assert isinstance(error, ErrorEvent) and error.retryable is False
    assert "model: unknown" in error.message


def test_runner_process_talks_to_the_api(serve_tcp: Any, run_runner: RunRunner) -> None:
    fake = tool_then_text()
    res = run_runner(make_input("run echo please", model=json.loads(settings(base_url=serve_tcp(fake)).to_json())))

    assert res.returncode == 0, res.stderr
    assert res.types == ["assistant", "tool_use", "tool_result", "assistant", "result"]
    assert res.of_type("tool_result")[0]["output"] == "from-fake\n"


def test_gateway_unix_socket(workspace: Path) -> None:
    fake = tool_then_text()
    # A short directory: unix socket paths are limited to ~100 bytes.
    with tempfile.TemporaryDirectory(prefix="gw") as tmp:
        path = str(Path(tmp) / "gateway.sock")
        server = UnixHTTPServer(path, fake.handler())
        running = _serve(server)
        next(running)
        try:
            events = run_with(AnthropicProvider(settings(socket_path=path)), workspace)
        finally:
            next(running, None)

    assert_tool_conversation(events, fake)
    assert fake.headers[0]["host"] == "gateway"
    assert sent_key(fake.headers[0]) == "via-gateway"


def test_missing_endpoint_is_rejected() -> None:
    with pytest.raises(InputError):
        AnthropicProvider(settings())
