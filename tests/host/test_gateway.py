"""The model gateway: the real ModelGateway on a unix socket, a fake upstream on loopback."""

from __future__ import annotations

import json
import os
import resource
import shutil
import socket
import ssl
import stat
import statistics
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import anthropic
import httpx
import pytest

from agent_runner.loop import run_agent
from agent_runner.protocol import (
    ContainerInput,
    Event,
    ModelSettings,
    ResultEvent,
    SdkMessage,
    TextDeltaEvent,
    ToolResultEvent,
    Usage,
)
from agent_runner.providers.anthropic import AnthropicProvider, _unix_socket_client
from fakes.anthropic_api import FakeAnthropic, api_error, message, message_stream
from fakes.openai_api import FakeOpenAI, chat, chat_stream, raw
from orchestrator.core.errors import GatewayError
from orchestrator.core.settings import Settings
from orchestrator.sandbox.gateway import GatewayConfig, ModelGateway, chmod_socket
from orchestrator.sandbox.gateway.metering import Meter, SseUsage
from orchestrator.sandbox.gateway.upstream import tls_context

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
    with (
        fake.serve() as upstream,
        ModelGateway(sock, GatewayConfig(base_url=upstream, api_key=KEY, timeout_s=10)) as gw,
    ):
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
        "/v1/messages",
        json=REQUEST,
        headers={"x-api-key": "via-gateway", "Authorization": "Bearer via-gateway", "anthropic-version": "2023-06-01"},
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


def test_usage_is_summed_over_requests(gateway: ModelGateway, client: httpx.Client, fake: FakeAnthropic) -> None:
    fake.replies.extend(message([{"type": "text", "text": f"r{n}"}], "end_turn", n=n) for n in (1, 2, 3))
    for _ in range(3):
        assert client.post("/v1/messages", json=REQUEST).status_code == 200

    assert (gateway.input_tokens, gateway.output_tokens) == (60, 6)
    assert gateway.requests == 3 and len(fake.calls) == 3


@pytest.mark.parametrize(
    ("method", "path"),
    [
        ("GET", "/v1/models"),
        ("POST", "/v1/complete"),
        ("POST", "/admin"),
        ("GET", "/v1/messages"),
        ("DELETE", "/v1/messages"),
        ("OPTIONS", "/v1/messages"),
        ("POST", "/v1/messages/batches"),
        ("POST", "/v1/chat/completions"),
    ],
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
    with fake.serve() as upstream, ModelGateway(path, GatewayConfig(base_url=upstream, api_key=KEY)) as gw:
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


# -- every run opens and closes a gateway: what that costs the worker ----------------


def test_closing_does_not_wait_for_a_poll(sock: Path, fake: FakeAnthropic) -> None:
    # The accept loop is woken by close(); serve_forever's 0.1 s poll made
    # every run's close wait for it (~100 ms right after a request).
    fake.replies.extend(message([{"type": "text", "text": "ok"}], "end_turn") for _ in range(5))
    took: list[float] = []
    with fake.serve() as upstream:
        for _ in range(5):
            gw = ModelGateway(sock, GatewayConfig(base_url=upstream, api_key=KEY))
            with gw, gateway_client(sock) as client:
                assert client.post("/v1/messages", json=REQUEST).status_code == 200
                start = time.monotonic()
            took.append(time.monotonic() - start)
            assert not gw._thread.is_alive() and not sock.exists()
            with pytest.raises(OSError), socket.socket(socket.AF_UNIX) as conn:
                conn.connect(str(sock))
    assert statistics.median(took) < 0.08, took


def test_gateways_share_one_verifying_tls_context(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # Loading the CA bundle is most of a new client's cost: once per process, not once per run.
    made: list[ssl.SSLContext] = []
    real = httpx.create_ssl_context

    def counted() -> ssl.SSLContext:
        made.append(real())
        return made[-1]

    monkeypatch.setattr(httpx, "create_ssl_context", counted)
    tls_context.cache_clear()
    try:
        for n in range(3):
            with ModelGateway(
                tmp_path / f"r{n}" / "model.sock", GatewayConfig(base_url="https://api.example", api_key=KEY)
            ):
                pass
    finally:
        tls_context.cache_clear()
    (ctx,) = made
    assert ctx.verify_mode == ssl.CERT_REQUIRED and ctx.check_hostname


def test_unreachable_upstream_is_502(sock: Path) -> None:
    # A bound but not listening port: connections are refused at once.
    with socket.socket() as closed:
        closed.bind(("127.0.0.1", 0))
        upstream = f"http://127.0.0.1:{closed.getsockname()[1]}"
        with (
            ModelGateway(sock, GatewayConfig(base_url=upstream, api_key=KEY, timeout_s=5)) as gw,
            gateway_client(sock) as c,
        ):
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
    fake.replies.extend(
        [
            message(
                [
                    {"type": "text", "text": "Let me check."},
                    {"type": "tool_use", "id": "toolu_01", "name": "bash", "input": {"command": "echo via-gw"}},
                ],
                "tool_use",
                n=1,
            ),
            message([{"type": "text", "text": "It printed via-gw."}], "end_turn", n=2),
        ]
    )
    workspace = tmp_path / "workspace"
    workspace.mkdir()
    provider = AnthropicProvider(
        ModelSettings(provider="anthropic", model="claude-fake", socket_path=str(gateway.socket_path))
    )
    inp = ContainerInput(
        run_id="run-gw",
        chat_jid="chat@test",
        group_folder="test",
        assistant_name="Andy",
        messages=[SdkMessage(role="user", content="run echo please")],
    )
    events: list[Event] = []
    run_agent(inp, provider, events.append, workspace=workspace)

    # The answers were streamed through the gateway: their text came as deltas first.
    deltas = [e for e in events if isinstance(e, TextDeltaEvent)]
    assert [d.block for d in deltas][0] == "1.0" and "".join(
        d.text for d in deltas
    ) == "Let me check.It printed via-gw."
    events = [e for e in events if not isinstance(e, TextDeltaEvent)]
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
    with (
        fake.serve() as upstream,
        ModelGateway(sock, GatewayConfig(base_url=upstream, api_key=KEY, token_budget=100)) as gw,
        gateway_client(sock) as client,
    ):
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

    fake.replies.extend(
        [message([{"type": "tool_use", "id": "t1", "name": "bash", "input": {"command": "true"}}], "tool_use", n=5)]
    )
    with fake.serve() as upstream, ModelGateway(sock, GatewayConfig(base_url=upstream, api_key=KEY, token_budget=50)):
        # max_tokens fits the budget: the request is sent, its answer crosses the budget.
        provider = AnthropicProvider(
            ModelSettings(provider="anthropic", model="claude-fake", socket_path=str(sock), max_tokens=16)
        )
        inp = ContainerInput(
            run_id="r",
            chat_jid="c",
            group_folder="g",
            assistant_name="A",
            messages=[SdkMessage(role="user", content="go")],
        )
        with pytest.raises(ProviderError) as err:
            run_agent(inp, provider, lambda e: None, workspace=tmp_path)
    assert not err.value.retryable and "budget" in str(err.value)
    assert len(fake.calls) == 1


# -- the sandbox is hostile: limits on what it can make the host spend ----------------

OPENAI_REQUEST = {"model": "fake-model", "max_tokens": 16, "messages": [{"role": "user", "content": "hi"}]}


def exchange(path: Path, data: bytes, timeout: float = 5.0) -> tuple[int, bytes, float]:
    """Send ``data`` on a new connection and read until the gateway closes it.

    Returns the status, the response's body and how long it took.  The
    connection is never half-closed: a gateway that waits for more (a body
    "until the end of the stream") makes the read time out and the test fail.
    """
    start = time.monotonic()
    with socket.socket(socket.AF_UNIX) as conn:
        conn.settimeout(timeout)
        conn.connect(str(path))
        conn.sendall(data)
        received = b""
        while chunk := conn.recv(65536):
            received += chunk
    head, _, body = received.partition(b"\r\n\r\n")
    return int(head.split(b" ", 2)[1]), body, time.monotonic() - start


def wait_for(condition: Callable[[], bool], timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, "timed out waiting"
        time.sleep(0.01)


def rss_kib() -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    return 0


@pytest.mark.parametrize(
    ("headers", "status"),
    [
        (b"Content-Length: -1\r\n", 400),
        (b"Content-Length: abc\r\n", 400),
        (b"Content-Length: +12\r\n", 400),
        (b"Content-Length: 12\r\nContent-Length: 13\r\n", 400),
        (b"", 411),
        (b"Transfer-Encoding: chunked\r\n", 411),
        (b"Content-Length: 12\r\nTransfer-Encoding: chunked\r\n", 411),
        (b"Content-Length: 33554433\r\n", 413),  # the default limit (32 MiB) plus one
        (b"Content-Length: 99999999999999999999999999999999\r\n", 413),
    ],
)
def test_a_bad_content_length_is_refused_without_reading_the_body(
    gateway: ModelGateway, fake: FakeAnthropic, headers: bytes, status: int
) -> None:
    # Some body follows, and the connection stays open: a gateway that read
    # "until the end" or "the whole length" would never answer.
    request = b"POST /v1/messages HTTP/1.1\r\nHost: gateway\r\n" + headers + b"\r\n" + b'{"model": "x"'
    got, body, took = exchange(gateway.socket_path, request)

    assert got == status
    error = json.loads(body)
    assert error["type"] == "error" and error["error"]["message"]
    assert took < 3, "answered at once, and closed the connection"
    assert fake.calls == [] and gateway.refused == 1 and gateway.requests == 0


def test_the_request_size_limit_is_a_setting(sock: Path, fake: FakeAnthropic) -> None:
    settings = Settings.load(env_file=None, gateway_max_request_bytes=1024)
    fake.replies.append(message([{"type": "text", "text": "ok"}], "end_turn"))
    with fake.serve() as upstream:
        settings = settings.replace(**{"anthropic_base_url": upstream, "anthropic_api_key": KEY})
        with ModelGateway.for_provider(sock, settings, "anthropic") as gw, gateway_client(sock) as client:
            assert gw.config.max_request_bytes == 1024
            big = {**REQUEST, "messages": [{"role": "user", "content": "x" * 2000}]}
            refused = client.post("/v1/messages", json=big)
            assert refused.status_code == 413
            assert refused.json()["error"]["type"] == "request_too_large"
            assert client.post("/v1/messages", json=REQUEST).status_code == 200
    assert len(fake.calls) == 1


def test_a_body_that_stops_arriving_is_given_up_on(sock: Path, fake: FakeAnthropic) -> None:
    with (
        fake.serve() as upstream,
        ModelGateway(sock, GatewayConfig(base_url=upstream, api_key=KEY, read_timeout_s=0.5)) as gw,
    ):
        got, body, took = exchange(sock, b'POST /v1/messages HTTP/1.1\r\nContent-Length: 100\r\n\r\n{"mod')
    assert got == 408 and json.loads(body)["error"]["type"] == "request_timeout"
    assert 0.4 < took < 3
    assert fake.calls == [] and gw.requests == 0


@pytest.mark.parametrize(
    "payload",
    [b"not json", b"[1, 2]", b'{"max_tokens": "many"}', b"[" * 100_000, b'{"stream": "yes"}'],
)
def test_a_body_that_is_not_a_request_never_goes_upstream(
    gateway: ModelGateway, client: httpx.Client, fake: FakeAnthropic, payload: bytes
) -> None:
    resp = client.post("/v1/messages", content=payload, headers={"content-type": "application/json"})
    assert resp.status_code == 400 and resp.json()["error"]["type"] == "invalid_request_error"
    assert fake.calls == []


def test_malformed_http_gets_a_json_error(gateway: ModelGateway, fake: FakeAnthropic) -> None:
    many = b"".join(b"X-Header-%d: v\r\n" % i for i in range(150))
    got, body, _ = exchange(gateway.socket_path, b"POST /v1/messages HTTP/1.1\r\n" + many + b"\r\n")
    assert got == 431 and json.loads(body)["type"] == "error"
    got, body, _ = exchange(gateway.socket_path, b"BREW /v1/messages HTTP/1.1\r\n\r\n")
    assert got == 501 and json.loads(body)["type"] == "error"
    got, body, _ = exchange(
        gateway.socket_path, b"POST http://evil.example/v1/messages HTTP/1.1\r\nContent-Length: 2\r\n\r\n{}"
    )
    assert got == 403
    assert fake.calls == []


def test_an_idle_keep_alive_connection_is_closed(sock: Path, fake: FakeAnthropic) -> None:
    fake.replies.append(message([{"type": "text", "text": "ok"}], "end_turn"))
    data = json.dumps(REQUEST).encode()
    with (
        fake.serve() as upstream,
        ModelGateway(sock, GatewayConfig(base_url=upstream, api_key=KEY, read_timeout_s=0.5)),
    ):
        with socket.socket(socket.AF_UNIX) as conn:
            conn.settimeout(5)
            conn.connect(str(sock))
            conn.sendall(b"POST /v1/messages HTTP/1.1\r\nContent-Length: %d\r\n\r\n%s" % (len(data), data))
            received = b""
            start = time.monotonic()
            while chunk := conn.recv(65536):  # the answer, then the close after the idle time
                received += chunk
            idle = time.monotonic() - start
    assert received.startswith(b"HTTP/1.1 200") and b'"text": "ok"' in received
    assert 0.4 < idle < 3


def test_a_thousand_idle_connections_cost_at_most_the_cap_in_threads(
    sock: Path, fake: FakeAnthropic, capsys: pytest.CaptureFixture[str]
) -> None:
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft < 1200:
        resource.setrlimit(resource.RLIMIT_NOFILE, (min(hard, 4096), hard))
    fake.replies.append(message([{"type": "text", "text": "still here"}], "end_turn"))
    conns: list[socket.socket] = []
    try:
        with (
            fake.serve() as upstream,
            ModelGateway(
                sock, GatewayConfig(base_url=upstream, api_key=KEY, max_connections=16, read_timeout_s=3.0)
            ) as gw,
        ):
            stop = threading.Event()
            peak = [0]

            def sample() -> None:
                while not stop.is_set():
                    peak[0] = max(peak[0], threading.active_count())
                    time.sleep(0.002)

            sampler = threading.Thread(target=sample, daemon=True)
            sampler.start()
            base_threads, base_rss = threading.active_count(), rss_kib()
            start = time.monotonic()
            for _ in range(1000):
                conn = socket.socket(socket.AF_UNIX)
                conn.connect(str(sock))
                conns.append(conn)
            opened_s = time.monotonic() - start
            wait_for(lambda: gw.dropped + 16 >= 1000 or time.monotonic() - start > 1.5, 5)
            held_threads, held_rss = threading.active_count(), rss_kib()

            # The ones over the cap were closed at once.
            assert gw.dropped >= 900, gw.dropped
            closed_at_once = 0
            for conn in conns[-100:]:
                conn.settimeout(0.2)
                try:
                    closed_at_once += conn.recv(1) == b""
                except TimeoutError:
                    pass  # one of those the gateway serves (if the first ones timed out already)
            assert closed_at_once >= 100 - 16
            # Those in the cap are closed once they have sent nothing for the read timeout.
            for conn in conns:
                conn.settimeout(10)
                try:
                    assert conn.recv(1) == b""
                except ConnectionResetError:
                    pass
            closed_s = time.monotonic() - start
            wait_for(lambda: threading.active_count() <= base_threads, 5)
            stop.set()
            sampler.join()

            assert peak[0] - base_threads <= 16, (peak[0], base_threads)
            with gateway_client(sock) as client:
                resp = client.post("/v1/messages", json=REQUEST)
            assert resp.status_code == 200 and resp.json()["content"][0]["text"] == "still here"
            assert fake.calls and gw.requests == 1
    finally:
        for conn in conns:
            conn.close()
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))
    with capsys.disabled():
        print(
            f"\n1000 connections: opened in {opened_s:.2f}s, {gw.dropped} closed at once; threads "
            f"{base_threads} -> peak {peak[0]} (held {held_threads}); RSS {base_rss} -> {held_rss} KiB; "
            f"all closed after {closed_s:.2f}s"
        )


def test_streamed_anthropic_usage_is_counted_with_cache_tokens(gateway: ModelGateway, fake: FakeAnthropic) -> None:
    fake.replies.append(message_stream("hello there world", n=4, cache_creation=100, cache_read=1000))
    # The real SDK's streaming client, on the socket the way the runner's provider connects.
    sdk = anthropic.Anthropic(
        api_key="not-the-key",
        base_url="http://gateway",
        max_retries=0,
        http_client=_unix_socket_client(str(gateway.socket_path)),
    )
    with sdk.messages.stream(
        model="claude-fake", max_tokens=16, messages=[{"role": "user", "content": "hi"}]
    ) as stream:
        final = stream.get_final_message()

    assert [b.text for b in final.content if b.type == "text"] == ["hellothereworld"]
    assert final.usage.output_tokens == 4 and final.usage.cache_read_input_tokens == 1000
    (call,) = fake.calls
    assert call.body["stream"] is True and call.headers["x-api-key"] == KEY
    # message_start: 40 input + 100 written to and 1000 read from the cache; message_delta: 4 output.
    assert (gateway.input_tokens, gateway.output_tokens) == (1140, 4)


def test_the_meter_reads_a_stream_as_the_runner_does_past_an_event_it_cannot_hold() -> None:
    # The runner's decoder (agent_runner/sse.py): CR line ends read, a 2 MiB event passed over
    # (the gateway relays it all the same), the final count after it read.
    _, chunks, _ = message_stream("hello there", n=2, cache_read=30)
    events = b"".join(chunks).replace(b"\n", b"\r")
    huge = (
        b'event: content_block_delta\rdata: {"type": "usage", "usage": {"output_tokens": 9'
        + b" " * (2 << 20)
        + b"}}\r\r"
    )
    at = events.index(b"event: message_delta")
    stream = events[:at] + huge + events[at:]
    meter = Meter()
    usage = SseUsage(meter)
    for start in range(0, len(stream), 4096):
        usage.feed(stream[start : start + 4096])
    assert meter.response_bytes == len(stream)
    assert meter.final and meter.tokens(0) == (20 + 30, 2) and meter.cache_tokens() == (30, 0)


def test_a_stream_is_passed_on_as_it_arrives(gateway: ModelGateway, client: httpx.Client, fake: FakeAnthropic) -> None:
    hold = threading.Event()
    fake.replies.append(message_stream("a b", n=2, hold=hold))
    start = time.monotonic()
    with client.stream("POST", "/v1/messages", json={**REQUEST, "stream": True}) as resp:
        assert resp.status_code == 200 and resp.headers["content-type"].startswith("text/event-stream")
        lines = resp.iter_lines()
        first = next(line for line in lines if line.startswith("data:"))
        # The fake holds the rest back until we got the start: a buffering gateway would wait 10 s.
        assert "message_start" in first and not hold.is_set() and time.monotonic() - start < 5
        hold.set()
        rest = list(lines)
    assert any("message_stop" in line for line in rest)
    assert (gateway.input_tokens, gateway.output_tokens) == (20, 2)


def test_a_stream_the_sandbox_hangs_up_on_is_charged(gateway: ModelGateway, fake: FakeAnthropic) -> None:
    hold = threading.Event()
    fake.replies.append(message_stream(" ".join(["word"] * 2000), n=2000, hold=hold))
    data = json.dumps({**REQUEST, "stream": True}).encode()
    with socket.socket(socket.AF_UNIX) as conn:
        conn.settimeout(5)
        conn.connect(str(gateway.socket_path))
        conn.sendall(b"POST /v1/messages HTTP/1.1\r\nContent-Length: %d\r\n\r\n%s" % (len(data), data))
        received = b""
        while b"message_start" not in received:
            received += conn.recv(65536)
    hold.set()  # the rest now meets a closed connection
    wait_for(lambda: gateway.input_tokens > 0)
    # The input is known from message_start; the output's final count never
    # came: what arrived is charged, not nothing (nor the 1 of message_start).
    assert gateway.input_tokens == 20_000
    assert gateway.output_tokens > 1


@pytest.fixture
def openai_fake() -> FakeOpenAI:
    return FakeOpenAI()


def openai_gateway(sock: Path, upstream: str, spent: Usage | None = None, **kw: Any) -> ModelGateway:
    return ModelGateway(sock, GatewayConfig(base_url=upstream, api_key=KEY, route="openai", **kw), spent=spent)


def test_streamed_openai_usage_is_asked_for_and_counted(sock: Path, openai_fake: FakeOpenAI) -> None:
    openai_fake.replies.append(chat_stream("hi there", n=3, cached=20))
    request = {**OPENAI_REQUEST, "stream": True}
    with openai_fake.serve() as upstream, openai_gateway(sock, upstream) as gw, gateway_client(sock) as client:
        with client.stream("POST", "/v1/chat/completions", json=request) as resp:
            assert resp.status_code == 200
            data = [line.removeprefix("data: ") for line in resp.iter_lines() if line.startswith("data: ")]
    assert data[-1] == "[DONE]"
    assert json.loads(data[-2])["usage"]["prompt_tokens"] == 30
    (call,) = openai_fake.calls
    # The gateway asked for usage; the rest of the request is as sent.
    assert call.body == {**request, "stream_options": {"include_usage": True}}
    assert call.headers["authorization"] == f"Bearer {KEY}"
    # Cached prompt tokens are part of prompt_tokens: counted once.
    assert (gw.input_tokens, gw.output_tokens) == (30, 3)


def test_a_stream_without_usage_is_still_charged(sock: Path, openai_fake: FakeOpenAI) -> None:
    # A server that ignores stream_options: no usage chunk at all.
    chunk = {"id": "c", "object": "chat.completion.chunk", "choices": [{"index": 0, "delta": {"content": "x" * 400}}]}
    openai_fake.replies.append(raw(200, f"data: {json.dumps(chunk)}\n\ndata: [DONE]\n\n", "text/event-stream"))
    with openai_fake.serve() as upstream, openai_gateway(sock, upstream) as gw, gateway_client(sock) as client:
        resp = client.post("/v1/chat/completions", json={**OPENAI_REQUEST, "stream": True})
        assert resp.status_code == 200 and "[DONE]" in resp.text
        # Estimated from the bytes (about 4 a token), never zero.
        assert gw.input_tokens > 0 and gw.output_tokens >= 100


def test_a_stream_that_declines_usage_is_refused(sock: Path, openai_fake: FakeOpenAI) -> None:
    request = {**OPENAI_REQUEST, "stream": True, "stream_options": {"include_usage": False}}
    with openai_fake.serve() as upstream, openai_gateway(sock, upstream) as gw, gateway_client(sock) as client:
        resp = client.post("/v1/chat/completions", json=request)
    assert resp.status_code == 400 and "include_usage" in resp.json()["error"]["message"]
    assert openai_fake.calls == [] and gw.requests == 0


def test_cache_tokens_of_answers_are_counted(gateway: ModelGateway, client: httpx.Client, fake: FakeAnthropic) -> None:
    fake.replies.append(
        message([{"type": "text", "text": "cached"}], "end_turn", n=1, cache_creation=200, cache_read=3000)
    )
    assert client.post("/v1/messages", json=REQUEST).status_code == 200
    assert (gateway.input_tokens, gateway.output_tokens) == (10 + 200 + 3000, 1)


def test_openai_cached_tokens_are_not_counted_twice(sock: Path, openai_fake: FakeOpenAI) -> None:
    status, body, headers = chat("ok", n=10)
    assert isinstance(body, dict)
    body["usage"]["prompt_tokens_details"] = {"cached_tokens": 80}
    openai_fake.replies.append((status, body, headers))
    with openai_fake.serve() as upstream, openai_gateway(sock, upstream) as gw, gateway_client(sock) as client:
        assert client.post("/v1/chat/completions", json=OPENAI_REQUEST).status_code == 200
        assert (gw.input_tokens, gw.output_tokens) == (100, 10)


def test_parallel_requests_cannot_overspend_the_budget(sock: Path) -> None:
    # Each answer costs 55 tokens; the budget allows one.  Slow answers: all
    # eight requests are in the gateway while the first is upstream.
    fake = FakeAnthropic(
        *(message([{"type": "text", "text": "r"}], "end_turn", n=5) for _ in range(8)),
        on_request=lambda rec: time.sleep(0.3),
    )
    statuses: list[int] = []
    with (
        fake.serve() as upstream,
        ModelGateway(sock, GatewayConfig(base_url=upstream, api_key=KEY, token_budget=56)) as gw,
    ):
        barrier = threading.Barrier(8)

        def ask() -> None:
            with gateway_client(sock) as c:
                barrier.wait()
                statuses.append(c.post("/v1/messages", json=REQUEST).status_code)

        threads = [threading.Thread(target=ask) for _ in range(8)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    assert sorted(statuses) == [200] + [403] * 7
    assert len(fake.calls) == 1
    assert (gw.input_tokens + gw.output_tokens) == 55


def test_a_request_whose_output_does_not_fit_the_budget_is_refused(sock: Path, fake: FakeAnthropic) -> None:
    with (
        fake.serve() as upstream,
        ModelGateway(sock, GatewayConfig(base_url=upstream, api_key=KEY, token_budget=100)) as gw,
        gateway_client(sock) as client,
    ):
        resp = client.post("/v1/messages", json={**REQUEST, "max_tokens": 500})
    assert resp.status_code == 403 and resp.json()["error"]["type"] == "budget_exceeded"
    assert "100 of its 100 tokens left" in resp.json()["error"]["message"]
    assert fake.calls == [] and gw.refused == 1


def test_a_request_without_an_output_cap_gets_what_is_left(sock: Path, openai_fake: FakeOpenAI) -> None:
    openai_fake.replies.append(chat("ok", n=1))
    request = {"model": "fake-model", "messages": [{"role": "user", "content": "hi"}]}
    with (
        openai_fake.serve() as upstream,
        openai_gateway(sock, upstream, token_budget=1000, spent=Usage(input_tokens=300, output_tokens=50)),
        gateway_client(sock) as client,
    ):
        assert client.post("/v1/chat/completions", json=request).status_code == 200
    assert openai_fake.calls[0].body == {"max_tokens": 650, **request}


def test_tokens_spent_by_earlier_attempts_count(sock: Path, fake: FakeAnthropic, tmp_path: Path) -> None:
    fake.replies.append(message([{"type": "text", "text": "r"}], "end_turn", n=1))
    with fake.serve() as upstream:
        settings = Settings.load(
            env_file=None,
            data_dir=tmp_path,
            run_token_budget=100,
            anthropic_base_url=upstream,
            anthropic_api_key=KEY,
        )
        # An earlier attempt spent the whole budget: refused at once.
        with (
            ModelGateway.for_provider(
                sock, settings, "anthropic", spent=Usage(input_tokens=90, output_tokens=10)
            ) as gw,
            gateway_client(sock) as client,
        ):
            resp = client.post("/v1/messages", json=REQUEST)
            assert resp.status_code == 403 and resp.json()["error"]["type"] == "budget_exceeded"
            assert "used 100 tokens; its budget is 100" in resp.json()["error"]["message"]
            assert gw.usage == Usage(input_tokens=90, output_tokens=10)
        assert fake.calls == []
        # Some left: the counts are the run's totals.
        with (
            ModelGateway.for_provider(sock, settings, "anthropic", spent=Usage(input_tokens=40, output_tokens=5)) as gw,
            gateway_client(sock) as client,
        ):
            assert client.post("/v1/messages", json=REQUEST).status_code == 200
            assert gw.usage == Usage(input_tokens=50, output_tokens=6)


def test_a_symlink_at_the_socket_path_is_replaced_not_followed(sock: Path, fake: FakeAnthropic, tmp_path: Path) -> None:
    victim = tmp_path / "victim"
    victim.write_text("secret")
    victim.chmod(0o600)
    sock.parent.mkdir(parents=True)
    sock.symlink_to(victim)
    fake.replies.append(message([{"type": "text", "text": "ok"}], "end_turn"))
    with (
        fake.serve() as upstream,
        ModelGateway(sock, GatewayConfig(base_url=upstream, api_key=KEY)),
        gateway_client(sock) as c,
    ):
        assert stat.S_ISSOCK(sock.lstat().st_mode)
        assert stat.S_IMODE(sock.lstat().st_mode) == 0o666
        assert c.post("/v1/messages", json=REQUEST).status_code == 200
    assert stat.S_IMODE(victim.stat().st_mode) == 0o600 and victim.read_text() == "secret"


def test_the_socket_chmod_refuses_what_is_not_a_socket(tmp_path: Path) -> None:
    # What the chmod meets if the sandbox swaps the socket after the bind.
    victim = tmp_path / "victim"
    victim.write_text("secret")
    victim.chmod(0o600)
    (tmp_path / "link").symlink_to(victim)
    fd = os.open(tmp_path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        for name in (b"link", b"victim"):
            with pytest.raises(GatewayError):
                chmod_socket(fd, name, 0o666)
    finally:
        os.close(fd)
    assert stat.S_IMODE(victim.stat().st_mode) == 0o600


@pytest.mark.parametrize(
    ("extra", "status", "kind"),
    [
        ({"max_tokens": None}, 400, "invalid_request_error"),  # null: no cap, and none may be added beside it
        ({"max_tokens": 100, "n": 8}, 403, "budget_exceeded"),  # 8 choices of up to 100 tokens each
        ({"max_completion_tokens": 900}, 403, "budget_exceeded"),
    ],
)
def test_output_caps_are_read_as_the_upstream_reads_them(
    sock: Path, openai_fake: FakeOpenAI, extra: dict[str, object], status: int, kind: str
) -> None:
    request = {"model": "fake-model", "messages": [{"role": "user", "content": "hi"}], **extra}
    with (
        openai_fake.serve() as upstream,
        openai_gateway(sock, upstream, token_budget=500) as gw,
        gateway_client(sock) as client,
    ):
        resp = client.post("/v1/chat/completions", json=request)
    assert (resp.status_code, resp.json()["error"]["type"]) == (status, kind)
    assert openai_fake.calls == [] and gw.requests == 0
