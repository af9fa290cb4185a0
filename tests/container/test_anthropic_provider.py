"""AnthropicProvider against a fake Messages API speaking the real wire format.

The fake server runs on loopback (or a unix socket, as the host gateway
does) and plays a scripted conversation; the real SDK, provider and agent
loop talk to it, and the tests check both what the runner emitted and what
the server received.
"""

from __future__ import annotations

import json
import socketserver
import tempfile
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest

from agent_runner.__main__ import run
from agent_runner.errors import InputError, ProviderError
from agent_runner.loop import run_agent
from agent_runner.protocol import (
    AssistantEvent,
    ContainerInput,
    ErrorEvent,
    Event,
    ModelSettings,
    ResultEvent,
    ToolResultEvent,
    ToolUseEvent,
)
from agent_runner.providers.anthropic import AnthropicProvider
from agent_runner.providers.base import ProviderMessage, TextBlock
from agent_runner.tools import tool_specs
from runner_harness import RunRunner, make_input

Reply = tuple[int, dict[str, Any], dict[str, str]]


def message(content: list[dict[str, Any]], stop_reason: str, n: int = 1) -> Reply:
    body = {
        "id": f"msg_fake_{n}",
        "type": "message",
        "role": "assistant",
        "model": "claude-fake",
        "content": content,
        "stop_reason": stop_reason,
        "stop_sequence": None,
        "usage": {"input_tokens": 10 * n, "output_tokens": n},
    }
    return 200, body, {}


def api_error(status: int, kind: str, text: str) -> Reply:
    # retry-after-ms keeps the SDK's retry backoff short in tests.
    return (
        status,
        {"type": "error", "error": {"type": kind, "message": text}},
        {"retry-after-ms": "10"},
    )


class FakeAnthropic:
    """Scripted POST /v1/messages; remembers every request it got."""

    def __init__(self, *replies: Reply) -> None:
        self.replies = list(replies)
        self.requests: list[dict[str, Any]] = []
        self.headers: list[dict[str, str]] = []

    def handler(self) -> type[BaseHTTPRequestHandler]:
        fake = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                length = int(self.headers.get("Content-Length", "0"))
                fake.requests.append(json.loads(self.rfile.read(length)))
                fake.headers.append({k.lower(): v for k, v in self.headers.items()})
                if self.path.split("?")[0] != "/v1/messages":
                    status, body, extra = (
                        404,
                        {
                            "type": "error",
                            "error": {"type": "not_found_error", "message": self.path},
                        },
                        {},
                    )
                elif fake.replies:
                    status, body, extra = fake.replies.pop(0)
                else:
                    status, body, extra = (
                        500,
                        {
                            "type": "error",
                            "error": {"type": "api_error", "message": "script exhausted"},
                        },
                        {},
                    )
                data = json.dumps(body).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                for key, value in extra.items():
                    self.send_header(key, value)
                self.end_headers()
                self.wfile.write(data)

            def address_string(self) -> str:  # client_address is '' on unix sockets
                return str(self.client_address[0]) if self.client_address else "unix"

            def log_message(self, format: str, *args: Any) -> None:
                pass

        return Handler


class UnixHTTPServer(socketserver.ThreadingMixIn, socketserver.UnixStreamServer):
    daemon_threads = True


def _serve(server: socketserver.BaseServer) -> Iterator[None]:
    thread = threading.Thread(target=server.serve_forever, args=(0.05,), daemon=True)
    thread.start()
    try:
        yield
    finally:
        server.shutdown()
        server.server_close()


@pytest.fixture
def serve_tcp() -> Iterator[Any]:
    """serve_tcp(fake) -> base_url of a loopback server playing ``fake``."""
    servers: list[Iterator[None]] = []

    def start(fake: FakeAnthropic) -> str:
        server = ThreadingHTTPServer(("127.0.0.1", 0), fake.handler())
        server.daemon_threads = True
        running = _serve(server)
        next(running)
        servers.append(running)
        return f"http://127.0.0.1:{server.server_address[1]}"

    yield start
    for running in servers:
        next(running, None)


def sent_key(headers: dict[str, str]) -> str | None:
    """The API key a request carried: SDK versions use x-api-key or a bearer token."""
    if "x-api-key" in headers:
        return headers["x-api-key"]
    auth = headers.get("authorization", "")
    return auth.removeprefix("Bearer ") if auth.startswith("Bearer ") else None


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
    inp = ContainerInput(**make_input("run echo please", **fields))
    run_agent(inp, provider, events.append, workspace=workspace)
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


def test_request_carries_tools_system_prompt_and_placeholder_key(
    serve_tcp: Any, workspace: Path
) -> None:
    fake = FakeAnthropic(message([{"type": "text", "text": "hi"}], "end_turn"))
    provider = AnthropicProvider(settings(base_url=serve_tcp(fake)))
    run_with(provider, workspace, assistant_name="Bob", system_notices=["Reply in French today."])

    (request,) = fake.requests
    assert request["model"] == "claude-fake" and request["max_tokens"] == 321
    assert "You are Bob" in request["system"] and "Reply in French today." in request["system"]
    assert request["messages"] == [
        {"role": "user", "content": [{"type": "text", "text": "run echo please"}]}
    ]
    spec = tool_specs()[0]
    assert request["tools"] == [
        {"name": "bash", "description": spec.description, "input_schema": spec.input_schema}
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
    doc = make_input("hi", model=settings(base_url=serve_tcp(fake)).model_dump())
    events: list[Event] = []
    code = run(json.dumps(doc).encode(), events.append, workspace)

    assert code == 1
    assert [e.type for e in events] == ["error"]
    error = events[0]
    assert isinstance(error, ErrorEvent) and error.retryable is False
    assert "model: unknown" in error.message


def test_runner_process_talks_to_the_api(serve_tcp: Any, run_runner: RunRunner) -> None:
    fake = tool_then_text()
    res = run_runner(
        make_input("run echo please", model=settings(base_url=serve_tcp(fake)).model_dump())
    )

    assert res.returncode == 0, res.stderr
    assert res.types == ["assistant", "tool_use", "tool_result", "assistant", "result"]
    assert res.events[2]["output"] == "from-fake\n"


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
