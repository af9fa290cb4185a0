"""OpenAICompatProvider against a fake Chat Completions server speaking the real wire format.

The fake (``fakes/openai_api.py``) runs on loopback, on a unix socket,
or behind the real host model gateway; the provider and the real agent loop
talk to it, and the tests check what the runner emitted and what the server
received.  Backoff sleeps are recorded instead of slept, except in one test
that checks a real wait.
"""

from __future__ import annotations

import json
import random
import socket
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from runner_harness import RunRunner, make_input

from agent_runner.errors import InputError, ProviderError
from agent_runner.loop import run_agent
from agent_runner.protocol import (
    AssistantEvent,
    Event,
    ModelSettings,
    ResultEvent,
    TextDeltaEvent,
    ThinkingEvent,
    ToolResultEvent,
    ToolUseEvent,
    decode_input,
)
from agent_runner.provider_registry import make_provider
from agent_runner.providers.base import ProviderMessage, TextBlock
from agent_runner.providers.openai_compat import OpenAICompatProvider
from agent_runner.tools import tool_specs
from fakes.openai_api import FakeOpenAI, Recorded, api_error, chat, raw, tool_call
from orchestrator.core.errors import ConfigError
from orchestrator.core.settings import Settings
from orchestrator.run.model_choice import model_settings
from orchestrator.sandbox.gateway import ModelGateway

KEY = "k"
HI = [ProviderMessage("user", [TextBlock("hi")])]


def settings(base_url: str | None = None, socket_path: str | None = None) -> ModelSettings:
    return ModelSettings(
        provider="openai", model="llama3.1:8b", max_tokens=321, base_url=base_url, socket_path=socket_path
    )


class Sleeps(list[float]):
    """An injected ``sleep`` that records the delays instead of waiting."""

    def __call__(self, seconds: float) -> None:
        self.append(seconds)


@pytest.fixture
def sleeps() -> Sleeps:
    return Sleeps()


@pytest.fixture
def serve(sleeps: Sleeps) -> Iterator[Any]:
    """serve(fake, **provider options) -> a provider talking to ``fake`` on loopback."""
    with_servers: list[Any] = []

    def start(fake: FakeOpenAI, **options: Any) -> OpenAICompatProvider:
        cm = fake.serve()
        base_url = cm.__enter__()
        with_servers.append(cm)
        options.setdefault("sleep", sleeps)
        options.setdefault("rng", random.Random(7))
        return OpenAICompatProvider(settings(base_url=base_url), **options)

    yield start
    for cm in with_servers:
        cm.__exit__(None, None, None)


def run_with(provider: Any, workspace: Path, prompt: str = "run echo please", **fields: Any) -> list[Event]:
    events: list[Event] = []

    def keep(event: Event) -> None:
        if not isinstance(event, TextDeltaEvent):  # the streamed text: test_streaming.py
            events.append(event)

    run_agent(decode_input(json.dumps(make_input(prompt, **fields))), provider, keep, workspace=workspace)
    return events


def answer_from_tool_result(rec: Recorded) -> tuple[int, Any, dict[str, str]]:
    """The second turn quotes what the tool printed, as a real model would."""
    tool_msg = rec.body["messages"][-1]
    assert tool_msg["role"] == "tool"
    printed = tool_msg["content"].splitlines()[-1]
    return chat(f"The command printed {printed}.", n=2)


def tool_then_text() -> FakeOpenAI:
    return FakeOpenAI(
        chat("Let me check.", [tool_call("call_abc", "bash", {"command": "echo from-fake"})], n=1),
        answer_from_tool_result,
    )


def assert_tool_conversation(events: list[Event], fake: FakeOpenAI) -> None:
    assert [e.type for e in events] == ["assistant", "tool_use", "tool_result", "assistant", "result"]
    tool_use, tool_result, final, result = events[1], events[2], events[3], events[4]
    assert isinstance(tool_use, ToolUseEvent) and tool_use.id == "call_abc"
    assert tool_use.input == {"command": "echo from-fake"}
    assert isinstance(tool_result, ToolResultEvent) and tool_result.exit_code == 0
    assert tool_result.output == "from-fake\n"
    assert final == AssistantEvent(text="The command printed from-fake.")
    assert isinstance(result, ResultEvent) and result.num_turns == 2
    assert result.stop_reason == "end_turn"
    assert (result.usage.input_tokens, result.usage.output_tokens) == (30, 3)

    # The second request: the assistant's call, then the tool result answering it.
    assert len(fake.requests) == 2
    sent = fake.requests[1]["messages"]
    assert [m["role"] for m in sent] == ["system", "user", "assistant", "tool"]
    assert sent[2]["content"] == "Let me check."
    (call,) = sent[2]["tool_calls"]
    assert call["id"] == "call_abc" and call["type"] == "function"
    assert call["function"]["name"] == "bash"
    assert isinstance(call["function"]["arguments"], str)
    assert json.loads(call["function"]["arguments"]) == {"command": "echo from-fake"}
    assert sent[3]["tool_call_id"] == "call_abc"
    assert sent[3]["content"] == "[exit_code=0]\nfrom-fake\n"


# ---------------------------------------------------------------------------
# Conversations
# ---------------------------------------------------------------------------


def test_text_reply_and_the_request_on_the_wire(serve: Any, workspace: Path) -> None:
    fake = FakeOpenAI(chat("Bonjour!", n=3))
    provider = serve(fake)
    events = run_with(provider, workspace, "hi", assistant_name="Bob", system_notices=["Reply in French."])

    assert events[0] == AssistantEvent(text="Bonjour!")
    result = events[1]
    assert isinstance(result, ResultEvent) and result.stop_reason == "end_turn" and result.num_turns == 1
    assert (result.usage.input_tokens, result.usage.output_tokens) == (30, 3)

    (call,) = fake.calls
    assert (call.method, call.path) == ("POST", "/v1/chat/completions")
    request = call.body
    assert request["model"] == "llama3.1:8b" and request["max_tokens"] == 321
    assert request["stream"] is True and request["stream_options"] == {"include_usage": True}
    system, user = request["messages"]
    assert system["role"] == "system" and "You are Bob" in system["content"]
    assert "Reply in French." in system["content"]
    assert user == {"role": "user", "content": "hi"}
    assert request["tools"] == [
        {"type": "function", "function": {"name": s.name, "description": s.description, "parameters": s.input_schema}}
        for s in tool_specs()
    ]
    assert "authorization" not in call.headers and "x-api-key" not in call.headers


def test_tool_use_round_trip_through_the_agent_loop(serve: Any, workspace: Path) -> None:
    fake = tool_then_text()
    events = run_with(serve(fake), workspace)
    assert_tool_conversation(events, fake)


def test_multi_step_tools_with_parallel_calls(serve: Any, workspace: Path) -> None:
    (workspace / "notes.txt").write_text("alpha\nbeta\n")
    fake = FakeOpenAI(
        chat(None, [tool_call("call_r", "read_file", {"path": "notes.txt"})], n=1),
        chat(
            None,
            [
                tool_call("call_w", "bash", {"command": "wc -l < notes.txt"}),
                tool_call("call_x", "bash", {"command": "exit 3"}),
            ],
            n=2,
        ),
        chat("notes.txt has 2 lines.", n=3),
    )
    events = run_with(serve(fake), workspace, "how long is notes.txt?")

    assert [e.type for e in events] == [
        "tool_use",
        "tool_result",
        "tool_use",
        "tool_use",
        "tool_result",
        "tool_result",
        "assistant",
        "result",
    ]
    assert isinstance(events[-1], ResultEvent) and events[-1].num_turns == 3
    assert len(fake.requests) == 3
    second = fake.requests[1]["messages"]
    assert [m["role"] for m in second] == ["system", "user", "assistant", "tool"]
    assert second[2]["content"] is None  # tool calls only: no text
    assert second[3]["tool_call_id"] == "call_r" and "alpha" in second[3]["content"]
    third = fake.requests[2]["messages"]
    assert [m["role"] for m in third] == ["system", "user", "assistant", "tool", "assistant", "tool", "tool"]
    assert [c["id"] for c in third[4]["tool_calls"]] == ["call_w", "call_x"]
    assert [(m["tool_call_id"], m["content"]) for m in third[5:]] == [
        ("call_w", "[exit_code=0]\n2\n"),
        ("call_x", "[exit_code=3]\n"),
    ]


def test_reasoning_becomes_thinking_and_is_not_sent_back(serve: Any, workspace: Path) -> None:
    fake = FakeOpenAI(
        chat(None, [tool_call("call_1", "bash", {"command": "true"})], reasoning_content="I should run true."),
        chat("Done.", finish_reason="length", n=2),
    )
    events = run_with(serve(fake), workspace)

    assert events[0] == ThinkingEvent(text="I should run true.")
    assert isinstance(events[-1], ResultEvent) and events[-1].stop_reason == "max_tokens"
    assistant = fake.requests[1]["messages"][2]
    assert set(assistant) == {"role", "content", "tool_calls"}
    assert "I should run true" not in json.dumps(fake.requests[1])


def test_tool_calls_mean_tool_use_whatever_the_finish_reason(serve: Any) -> None:
    # Some servers (older Ollama) say "stop" even when the model calls tools.
    fake = FakeOpenAI(chat(None, [tool_call("call_1", "bash", {"command": "true"})], finish_reason="stop"))
    response = serve(fake).complete("sys", HI, tool_specs())
    assert response.stop_reason == "tool_use"
    assert [u.id for u in response.tool_uses()] == ["call_1"]


def test_unparsable_arguments_go_back_to_the_model(serve: Any, workspace: Path) -> None:
    # A truncated JSON object, as small local models sometimes produce.
    broken = '{"command": "echo hi"'
    fake = FakeOpenAI(
        chat(None, [tool_call("call_bad", "bash", broken)], n=1),
        chat(None, [tool_call("call_ok", "bash", {"command": "echo hi"})], n=2),
        chat("hi was printed.", n=3),
    )
    events = run_with(serve(fake), workspace)

    assert [e.type for e in events] == ["tool_use", "tool_result", "tool_use", "tool_result", "assistant", "result"]
    bad_use, bad_result = events[0], events[1]
    assert isinstance(bad_use, ToolUseEvent) and bad_use.input == {"_raw": broken}
    assert isinstance(bad_result, ToolResultEvent) and bad_result.is_error and bad_result.exit_code != 0
    assert isinstance(events[3], ToolResultEvent) and events[3].output == "hi\n"

    second = fake.requests[1]["messages"]
    (call,) = second[2]["tool_calls"]
    assert json.loads(call["function"]["arguments"]) == {"_raw": broken}
    tool_msg = second[3]
    assert tool_msg["tool_call_id"] == "call_bad"
    assert tool_msg["content"].startswith("[the arguments of this call were not a valid JSON object: " + broken)
    assert "command" in tool_msg["content"]  # then the tool's own complaint


# ---------------------------------------------------------------------------
# Retries and errors
# ---------------------------------------------------------------------------


def test_rate_limit_is_retried_after_retry_after(serve: Any, sleeps: Sleeps) -> None:
    fake = FakeOpenAI(
        api_error(429, "Rate limit reached", "rate_limit_exceeded", {"retry-after": "2"}),
        chat("after the wait"),
    )
    response = serve(fake).complete("sys", HI, [])

    assert response.content == [TextBlock("after the wait")]
    assert len(fake.calls) == 2
    assert sleeps == [2.0]


def test_retry_after_is_capped_and_really_waited(serve: Any) -> None:
    fake = FakeOpenAI(
        api_error(429, "slow down", headers={"retry-after": "3600"}),
        chat("ok"),
    )
    provider = serve(fake, sleep=time.sleep, retry_after_cap_s=0.3)
    provider.complete("sys", HI, [])

    assert len(fake.times) == 2
    assert 0.3 <= fake.times[1] - fake.times[0] < 3  # capped, and slept for real


def test_server_errors_are_retried_with_exponential_backoff(serve: Any, sleeps: Sleeps) -> None:
    fake = FakeOpenAI(api_error(500, "boom", "server_error"), api_error(503, "busy", "server_error"), chat("recovered"))
    response = serve(fake).complete("sys", HI, [])

    assert response.content == [TextBlock("recovered")] and response.stop_reason == "end_turn"
    assert len(fake.calls) == 3
    assert len(sleeps) == 2
    assert 0.25 <= sleeps[0] <= 0.5 and 0.5 <= sleeps[1] <= 1.0  # base 0.5 s, doubling, jittered


def test_persistent_server_error_is_a_retryable_provider_error(serve: Any, sleeps: Sleeps) -> None:
    fake = FakeOpenAI(*[api_error(500, "model crashed", "server_error")] * 4)
    with pytest.raises(ProviderError) as caught:
        serve(fake).complete("sys", HI, [])

    assert caught.value.retryable and caught.value.status_code == 500
    assert "model crashed" in str(caught.value) and "4 attempts" in str(caught.value)
    assert len(fake.calls) == 4  # the first try and 3 retries
    assert len(sleeps) == 3 and sleeps == sorted(sleeps)


def test_timeout_status_is_retried(serve: Any, sleeps: Sleeps) -> None:
    fake = FakeOpenAI(api_error(408, "request timeout"), chat("ok"))
    serve(fake).complete("sys", HI, [])
    assert len(fake.calls) == 2 and len(sleeps) == 1


def test_bad_request_is_not_retried(serve: Any, sleeps: Sleeps) -> None:
    fake = FakeOpenAI(api_error(400, "model 'llama3.1:8b' not found, try pulling it first"))
    with pytest.raises(ProviderError) as caught:
        serve(fake).complete("sys", HI, [])

    assert not caught.value.retryable and caught.value.status_code == 400
    assert "not found, try pulling it first" in str(caught.value)
    assert len(fake.calls) == 1 and sleeps == []


def test_connection_errors_are_retried_then_retryable(sleeps: Sleeps) -> None:
    with socket.socket() as closed:  # bound, not listening: connections are refused at once
        closed.bind(("127.0.0.1", 0))
        base_url = f"http://127.0.0.1:{closed.getsockname()[1]}"
        provider = OpenAICompatProvider(settings(base_url=base_url), sleep=sleeps)
        with pytest.raises(ProviderError) as caught:
            provider.complete("sys", HI, [])

    assert caught.value.retryable and caught.value.status_code is None
    assert "cannot reach" in str(caught.value)
    assert len(sleeps) == 3


@pytest.mark.parametrize(
    ("reply", "expected"),
    [
        (
            raw(200, "<html><body>Welcome to nginx!</body></html>", "text/html"),
            "not JSON: <html><body>Welcome to nginx!",
        ),
        (raw(200, '{"id": "chatcmpl-1", "choi'), 'not JSON: {"id": "chatcmpl-1", "choi'),
        ((200, {"id": "chatcmpl-1", "object": "chat.completion"}, {}), 'no choices: {"id": "chatcmpl-1"'),
        (
            (200, {"error": {"message": "upstream overloaded"}}, {}),
            'no choices: {"error": {"message": "upstream overloaded"',
        ),
        ((200, {"choices": []}, {}), 'no choices: {"choices": []}'),
        ((200, {"choices": [{"index": 0, "finish_reason": "stop"}]}, {}), "choice has no message"),
    ],
    ids=["html", "truncated", "no-choices", "error-in-200", "empty-choices", "no-message"],
)
def test_unusable_body_is_a_clear_error(serve: Any, sleeps: Sleeps, reply: Any, expected: str) -> None:
    fake = FakeOpenAI(reply)
    with pytest.raises(ProviderError) as caught:
        serve(fake).complete("sys", HI, [])

    assert expected in str(caught.value)
    assert not caught.value.retryable
    assert len(fake.calls) == 1 and sleeps == []


def test_error_body_that_is_not_json_is_quoted(serve: Any, sleeps: Sleeps) -> None:
    fake = FakeOpenAI(raw(404, "404 page not found", "text/plain"))
    with pytest.raises(ProviderError) as caught:
        serve(fake).complete("sys", HI, [])
    assert str(caught.value) == "chat completions error 404: 404 page not found"
    assert not caught.value.retryable


# ---------------------------------------------------------------------------
# Transports, wiring, host settings
# ---------------------------------------------------------------------------


def test_unix_socket_and_the_factory(workspace: Path) -> None:
    fake = tool_then_text()
    with tempfile.TemporaryDirectory(prefix="oa") as tmp:
        path = str(Path(tmp) / "model.sock")
        with fake.serve_unix(path):
            provider = make_provider(settings(socket_path=path), assistant_name="Andy")
            assert isinstance(provider, OpenAICompatProvider)
            events = run_with(provider, workspace)

    assert_tool_conversation(events, fake)
    assert fake.headers[0]["host"] == "gateway"
    assert all("authorization" not in h for h in fake.headers)


def test_base_url_with_v1_suffix(serve: Any) -> None:
    fake = FakeOpenAI(chat("ok"))
    with fake.serve() as base_url:
        OpenAICompatProvider(settings(base_url=base_url + "/v1/")).complete("sys", HI, [])
    assert fake.calls[0].path == "/v1/chat/completions"


def test_runner_process_talks_to_the_server(run_runner: RunRunner) -> None:
    fake = tool_then_text()
    with fake.serve() as base_url:
        res = run_runner(make_input("run echo please", model=json.loads(settings(base_url=base_url).to_json())))

    assert res.returncode == 0, res.stderr
    assert res.types == ["assistant", "tool_use", "tool_result", "assistant", "result"]
    assert res.of_type("assistant")[-1]["text"] == "The command printed from-fake."


def test_missing_endpoint_is_rejected() -> None:
    with pytest.raises(InputError):
        OpenAICompatProvider(settings())


def test_host_settings_and_model_spec() -> None:
    s = Settings.load(model="openai:llama3.1:8b", max_tokens=77, env_file=None)
    assert model_settings(s) == ModelSettings(provider="openai", model="llama3.1:8b", max_tokens=77)
    assert s.provider.openai_base_url == "http://127.0.0.1:11434" and s.provider.openai_api_key == ""
    custom = Settings.load(openai_base_url="https://api.openai.com/v1/", env_file=None)
    assert custom.provider.openai_base_url == "https://api.openai.com"
    with pytest.raises(ConfigError, match="openai:<model id>"):
        model_settings(Settings.load(model="openai:", env_file=None))


# ---------------------------------------------------------------------------
# Through the host's model gateway
# ---------------------------------------------------------------------------


@pytest.fixture
def gateway_sock() -> Iterator[Path]:
    with tempfile.TemporaryDirectory(prefix="gw") as tmp:
        yield Path(tmp) / "run" / "model.sock"


def test_through_the_gateway_with_the_key_injected(gateway_sock: Path, workspace: Path) -> None:
    fake = tool_then_text()
    with fake.serve() as upstream:
        host = Settings.load(openai_base_url=upstream + "/v1", openai_api_key=KEY, env_file=None)
        with ModelGateway.for_provider(gateway_sock, host, "openai") as gateway:
            provider = OpenAICompatProvider(settings(socket_path=str(gateway_sock)))
            runner_sent: list[dict[str, str]] = []
            provider._client.event_hooks["request"].append(
                lambda request: runner_sent.append({k.lower(): v for k, v in request.headers.items()})
            )
            events = run_with(provider, workspace)

    assert_tool_conversation(events, fake)
    assert len(runner_sent) == 2
    assert all("authorization" not in h and "x-api-key" not in h for h in runner_sent)
    assert [c.path for c in fake.calls] == ["/v1/chat/completions"] * 2
    assert all(c.headers["authorization"] == f"Bearer {KEY}" for c in fake.calls)
    assert all("x-api-key" not in c.headers for c in fake.calls)
    assert (gateway.input_tokens, gateway.output_tokens) == fake.usage() == (30, 3)
    assert gateway.requests == 2 and gateway.refused == 0


def test_gateway_replaces_a_forged_key_and_refuses_other_routes(gateway_sock: Path) -> None:
    import httpx

    fake = FakeOpenAI(chat("ok"))
    with fake.serve() as upstream:
        host = Settings.load(openai_base_url=upstream, openai_api_key=KEY, env_file=None)
        with (
            ModelGateway.for_provider(gateway_sock, host, "openai") as gateway,
            httpx.Client(
                transport=httpx.HTTPTransport(uds=str(gateway_sock)), base_url="http://gateway", timeout=10
            ) as client,
        ):
            forged = {"authorization": "Bearer sandbox-forged", "x-api-key": "sandbox-forged"}
            body = {"model": "m", "messages": [{"role": "user", "content": "hi"}]}
            assert client.post("/v1/chat/completions", json=body, headers=forged).status_code == 200
            assert client.post("/v1/messages", json=body).status_code == 403
            assert client.get("/v1/models").status_code == 403

    (call,) = fake.calls
    assert call.headers["authorization"] == f"Bearer {KEY}"
    assert "sandbox-forged" not in json.dumps(call.headers)
    assert gateway.requests == 1 and gateway.refused == 2


def test_keyless_gateway_sends_no_authorization(gateway_sock: Path) -> None:
    fake = FakeOpenAI(chat("ok", n=4))
    with fake.serve() as upstream:
        host = Settings.load(openai_base_url=upstream, openai_api_key="", env_file=None)
        with ModelGateway.for_provider(gateway_sock, host, "openai") as gateway:
            OpenAICompatProvider(settings(socket_path=str(gateway_sock))).complete("sys", HI, [])

    assert "authorization" not in fake.calls[0].headers and "x-api-key" not in fake.calls[0].headers
    assert (gateway.input_tokens, gateway.output_tokens) == (40, 4)


def test_gateway_passes_rate_limits_through_to_the_provider_retry(gateway_sock: Path, sleeps: Sleeps) -> None:
    fake = FakeOpenAI(api_error(429, "slow down", headers={"retry-after": "5"}), chat("ok"))
    with fake.serve() as upstream:
        host = Settings.load(openai_base_url=upstream, openai_api_key=KEY, env_file=None)
        with ModelGateway.for_provider(gateway_sock, host, "openai") as gateway:
            provider = OpenAICompatProvider(settings(socket_path=str(gateway_sock)), sleep=sleeps)
            assert provider.complete("sys", HI, []).content == [TextBlock("ok")]

    assert sleeps == [5.0] and len(fake.calls) == 2
    assert (gateway.input_tokens, gateway.output_tokens) == (10, 1)  # the 429 counted nothing
