"""The model gateway: the real ModelGateway on a unix socket, a fake upstream on loopback."""

from __future__ import annotations

import shutil
import socket
import tempfile
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from agent_runner.loop import run_agent
from agent_runner.protocol import ContainerInput, Event, ModelSettings, ResultEvent, SdkMessage, ToolResultEvent
from agent_runner.providers.anthropic import AnthropicProvider

from orchestrator.gateway import ModelGateway
from tests.fakes.anthropic_api import FakeAnthropic, api_error, message

KEY = "sk-gateway-key-42"
REQUEST = {"model": "claude-fake", "max_tokens": 16, "messages": [{"role": "user", "content": "hi"}]}


@pytest.fixture
def sock(tmp_path: Path) -> Path:
    path = tmp_path / "run" / "model.sock"
    assert len(str(path)) < 100, "unix socket paths are limited to ~100 bytes"
    return path


def gateway_client(path: Path) -> httpx.Client:
    return httpx.Client(transport=httpx.HTTPTransport(uds=str(path)), base_url="http://gateway", timeout=10)


@pytest.fixture
def fake() -> FakeAnthropic:
    return FakeAnthropic()


@pytest.fixture
def gateway(sock: Path, fake: FakeAnthropic) -> Iterator[ModelGateway]:
    with fake.serve() as upstream, ModelGateway(sock, upstream=upstream, api_key=KEY, timeout_s=10) as gw:
        yield gw


@pytest.fixture
def client(gateway: ModelGateway) -> Iterator[httpx.Client]:
    with gateway_client(gateway.socket_path) as c:
        yield c


def test_forwards_messages_with_the_gateway_key_only(
    gateway: ModelGateway, client: httpx.Client, fake: FakeAnthropic
) -> None:
    fake.replies.append(message([{"type": "text", "text": "hello"}], "end_turn"))
    resp = client.post(
        "/v1/messages", json=REQUEST,
        headers={"x-api-key": "via-gateway", "Authorization": "Bearer via-gateway",
                 "anthropic-version": "2023-06-01"},
    )

    assert resp.status_code == 200, resp.text
    assert resp.json()["content"] == [{"type": "text", "text": "hello"}]
    (call,) = fake.calls
    assert (call.method, call.path) == ("POST", "/v1/messages")
    assert call.body == REQUEST
    assert call.headers["x-api-key"] == KEY
    assert "authorization" not in call.headers
    assert "via-gateway" not in str(call.headers)
    assert call.headers["anthropic-version"] == "2023-06-01"  # ordinary headers pass
    assert gateway.requests == 1 and gateway.refused == 0


def test_usage_is_summed_over_requests(
    gateway: ModelGateway, client: httpx.Client, fake: FakeAnthropic
) -> None:
    fake.replies.extend(message([{"type": "text", "text": f"r{n}"}], "end_turn", n=n) for n in (1, 2, 3))
    for _ in range(3):
        assert client.post("/v1/messages", json=REQUEST).status_code == 200

    assert (gateway.input_tokens, gateway.output_tokens) == (60, 6)
    assert gateway.requests == 3 and len(fake.calls) == 3


@pytest.mark.parametrize(
    ("method", "path"),
    [("GET", "/v1/models"), ("POST", "/v1/complete"), ("POST", "/admin"),
     ("GET", "/v1/messages"), ("DELETE", "/v1/messages")],
)
def test_other_routes_are_refused(
    gateway: ModelGateway, client: httpx.Client, fake: FakeAnthropic, method: str, path: str
) -> None:
    resp = client.request(method, path, json=REQUEST if method == "POST" else None)

    assert resp.status_code == 403
    assert resp.json()["type"] == "error"
    assert fake.calls == []
    assert gateway.refused == 1 and gateway.requests == 0


def test_socket_in_a_folder_with_a_long_path(tmp_path: Path, fake: FakeAnthropic) -> None:
    # The run folder lives under the data dir: its path may exceed what a
    # unix socket address can hold (~107 bytes).
    folder = tmp_path / ("d" * 60) / ("r" * 40)
    path = folder / "model.sock"
    assert len(str(path)) > 108
    fake.replies.append(message([{"type": "text", "text": "hello"}], "end_turn"))
    with fake.serve() as upstream, ModelGateway(path, upstream=upstream, api_key=KEY) as gw:
        assert path.is_socket()
        # Connect the way the container does: through a short path to the folder.
        short = Path(tempfile.mkdtemp(prefix="gw"))
        try:
            (short / "run").symlink_to(folder)
            with gateway_client(short / "run" / "model.sock") as c:
                assert c.post("/v1/messages", json=REQUEST).status_code == 200
        finally:
            shutil.rmtree(short)
    assert gw.requests == 1 and fake.calls[0].headers["x-api-key"] == KEY
    assert not path.exists()


def test_unreachable_upstream_is_502(sock: Path) -> None:
    # A bound but not listening port: connections are refused at once.
    with socket.socket() as closed:
        closed.bind(("127.0.0.1", 0))
        upstream = f"http://127.0.0.1:{closed.getsockname()[1]}"
        with ModelGateway(sock, upstream=upstream, api_key=KEY, timeout_s=5) as gw, gateway_client(sock) as c:
            resp = c.post("/v1/messages", json=REQUEST)

    assert resp.status_code == 502
    body = resp.json()
    assert body["type"] == "error" and body["error"]["type"] == "api_error"
    assert "unreachable" in body["error"]["message"]
    assert KEY not in resp.text
    assert (gw.input_tokens, gw.output_tokens) == (0, 0)


def test_rate_limit_passes_through_with_retry_after(
    gateway: ModelGateway, client: httpx.Client, fake: FakeAnthropic
) -> None:
    fake.replies.append(api_error(429, "rate_limit_error", "slow down", {"retry-after": "7"}))
    resp = client.post("/v1/messages", json=REQUEST)

    assert resp.status_code == 429
    assert resp.headers["retry-after"] == "7"
    assert resp.json() == {"type": "error", "error": {"type": "rate_limit_error", "message": "slow down"}}
    assert len(fake.calls) == 1
    assert (gateway.input_tokens, gateway.output_tokens) == (0, 0)


def test_real_provider_completes_a_tool_conversation_through_the_gateway(
    gateway: ModelGateway, fake: FakeAnthropic, tmp_path: Path
) -> None:
    fake.replies.extend([
        message(
            [{"type": "text", "text": "Let me check."},
             {"type": "tool_use", "id": "toolu_01", "name": "bash", "input": {"command": "echo via-gw"}}],
            "tool_use", n=1,
        ),
        message([{"type": "text", "text": "It printed via-gw."}], "end_turn", n=2),
    ])
    workspace = tmp_path / "workspace"
    workspace.mkdir()
    provider = AnthropicProvider(
        ModelSettings(provider="anthropic", model="claude-fake", socket_path=str(gateway.socket_path))
    )
    inp = ContainerInput(
        run_id="run-gw", chat_jid="chat@test", group_folder="test", assistant_name="Andy",
        messages=[SdkMessage(role="user", content="run echo please")],
    )
    events: list[Event] = []
    run_agent(inp, provider, events.append, workspace=workspace)

    assert [e.type for e in events] == ["assistant", "tool_use", "tool_result", "assistant", "result"]
    assert isinstance(events[2], ToolResultEvent) and events[2].output == "via-gw\n"
    assert isinstance(events[4], ResultEvent) and events[4].num_turns == 2
    assert len(fake.calls) == 2
    assert all(c.headers["x-api-key"] == KEY and "authorization" not in c.headers for c in fake.calls)
    (result_block,) = fake.requests[1]["messages"][2]["content"]
    assert result_block["type"] == "tool_result" and "via-gw" in result_block["content"]
    assert (gateway.input_tokens, gateway.output_tokens) == (30, 3)
    assert gateway.requests == 2


def test_the_token_budget_refuses_the_request_after_it_is_spent(sock: Path, fake: FakeAnthropic) -> None:
    # Each reply costs 10*n + n tokens (n = 5: 55); the budget of 100 allows two.
    fake.replies.extend(message([{"type": "text", "text": "r"}], "end_turn", n=5) for _ in range(3))
    with fake.serve() as upstream, ModelGateway(sock, upstream=upstream, api_key=KEY, token_budget=100) as gw, \
            gateway_client(sock) as client:
        assert client.post("/v1/messages", json=REQUEST).status_code == 200
        assert client.post("/v1/messages", json=REQUEST).status_code == 200
        refused = client.post("/v1/messages", json=REQUEST)
        assert refused.status_code == 403
        assert refused.json()["error"]["type"] == "budget_exceeded"
        assert "used 110 tokens; its budget is 100" in refused.json()["error"]["message"]
        assert len(fake.calls) == 2  # the refused request never reached the upstream
        assert (gw.input_tokens, gw.output_tokens, gw.refused) == (100, 10, 1)


def test_a_budget_error_fails_the_run_without_retries(sock: Path, fake: FakeAnthropic, tmp_path: Path) -> None:
    from agent_runner.errors import ProviderError

    fake.replies.extend([message([{"type": "tool_use", "id": "t1", "name": "bash", "input": {"command": "true"}}],
                                 "tool_use", n=5)])
    with fake.serve() as upstream, ModelGateway(sock, upstream=upstream, api_key=KEY, token_budget=50):
        provider = AnthropicProvider(ModelSettings(provider="anthropic", model="claude-fake", socket_path=str(sock)))
        inp = ContainerInput(run_id="r", chat_jid="c", group_folder="g", assistant_name="A",
                             messages=[SdkMessage(role="user", content="go")])
        with pytest.raises(ProviderError) as err:
            run_agent(inp, provider, lambda e: None, workspace=tmp_path)
    assert not err.value.retryable and "budget" in str(err.value)
    assert len(fake.calls) == 1
