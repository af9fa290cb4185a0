"""The gateway decides what a run may ask for: its model and output cap are the host's.

The real ModelGateway on a unix socket, fake upstreams on loopback speaking the
Anthropic and OpenAI wire formats, and the real Anthropic SDK as the client:
a body naming another model, or asking for more output than the host allows,
is refused with an error that says what is allowed (policy ``refuse``) or sent
with the host's values (``rewrite``); whatever the body does to hide a key
(duplicates, escapes), the upstream reads the value the gateway checked.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import msgspec
import pytest

from agent_runner.errors import ProviderError
from agent_runner.protocol import ModelSettings, Usage
from agent_runner.providers.anthropic import AnthropicProvider
from agent_runner.providers.base import ProviderMessage, TextBlock
from fakes.anthropic_api import FakeAnthropic, message
from fakes.openai_api import FakeOpenAI, chat
from orchestrator.core.settings import Settings
from orchestrator.sandbox.gateway import GatewayConfig, ModelGateway
from orchestrator.sandbox.gateway.config import ModelPolicy
from orchestrator.sandbox.gateway.wire import MAX_REWRITE_COLONS

KEY = "sk-policy-key"
MODEL = "claude-allowed-1"
EXPENSIVE = "claude-expensive-9"
CAP = 64
MESSAGES = [{"role": "user", "content": 'hi \u00e9 "model": {"max_tokens": 1}'}]


@pytest.fixture
def sock(tmp_path: Path) -> Path:
    path = tmp_path / "g" / "model.sock"
    assert len(str(path)) < 100
    return path


@pytest.fixture
def fake() -> FakeAnthropic:
    return FakeAnthropic()


def client_for(path: Path) -> httpx.Client:
    return httpx.Client(transport=httpx.HTTPTransport(uds=str(path)), base_url="http://gateway", timeout=10)


def held(
    sock: Path, upstream: str, policy: ModelPolicy = "refuse", spent: Usage | None = None, **kw: Any
) -> ModelGateway:
    config = GatewayConfig(base_url=upstream, api_key=KEY, model=MODEL, max_tokens=CAP, model_policy=policy, **kw)
    return ModelGateway(sock, config, spent=spent)


@pytest.fixture
def refusing(sock: Path, fake: FakeAnthropic) -> Iterator[tuple[ModelGateway, httpx.Client]]:
    with fake.serve() as upstream, held(sock, upstream) as gw, client_for(sock) as client:
        yield gw, client


@pytest.fixture
def rewriting(sock: Path, fake: FakeAnthropic) -> Iterator[tuple[ModelGateway, httpx.Client]]:
    with fake.serve() as upstream, held(sock, upstream, "rewrite") as gw, client_for(sock) as client:
        yield gw, client


def post(client: httpx.Client, body: bytes | dict[str, Any], path: str = "/v1/messages") -> httpx.Response:
    data = body if isinstance(body, bytes) else json.dumps(body).encode()
    return client.post(path, content=data, headers={"content-type": "application/json"})


def ok(fake: FakeAnthropic) -> None:
    fake.replies.append(message([{"type": "text", "text": "ok"}], "end_turn"))


def test_a_request_for_another_model_is_refused_saying_what_is_allowed(
    refusing: tuple[ModelGateway, httpx.Client], fake: FakeAnthropic
) -> None:
    gw, client = refusing
    resp = post(client, {"model": EXPENSIVE, "max_tokens": 16, "messages": MESSAGES})
    assert resp.status_code == 403
    error = resp.json()["error"]
    assert error["type"] == "model_not_allowed"
    assert f"'{MODEL}' only, not '{EXPENSIVE}'" in error["message"]
    assert "ORCHESTRATOR_MODEL" in error["message"] and "ORCHESTRATOR_GATEWAY_MODEL_POLICY=rewrite" in error["message"]
    assert fake.calls == [] and gw.refused == 1 and gw.requests == 0
    # null is another model too
    assert post(client, {"model": None, "max_tokens": 16, "messages": MESSAGES}).status_code == 403
    assert fake.calls == []


def test_a_request_that_keeps_to_the_policy_goes_upstream_byte_for_byte(
    refusing: tuple[ModelGateway, httpx.Client], fake: FakeAnthropic
) -> None:
    ok(fake)
    body = json.dumps({"model": MODEL, "max_tokens": CAP, "messages": MESSAGES}, indent=1).encode()
    assert post(refusing[1], body).status_code == 200
    assert fake.calls[0].raw == body


def test_a_missing_model_and_cap_are_the_hosts(
    refusing: tuple[ModelGateway, httpx.Client], fake: FakeAnthropic
) -> None:
    ok(fake)
    assert post(refusing[1], {"messages": MESSAGES}).status_code == 200
    assert fake.requests[0] == {"model": MODEL, "max_tokens": CAP, "messages": MESSAGES}


@pytest.mark.parametrize("field", ["max_tokens", "max_completion_tokens"])
def test_an_output_cap_over_the_hosts_is_refused(
    refusing: tuple[ModelGateway, httpx.Client], fake: FakeAnthropic, field: str
) -> None:
    gw, client = refusing
    resp = post(client, {"model": MODEL, field: CAP + 1, "messages": MESSAGES})
    assert resp.status_code == 403
    error = resp.json()["error"]
    assert error["type"] == "max_tokens_not_allowed"
    assert f"capped at {CAP} output tokens (ORCHESTRATOR_MAX_TOKENS)" in error["message"]
    assert f"{field}={CAP + 1}" in error["message"]
    assert fake.calls == [] and gw.budget_refusals == 0


def test_the_rewrite_policy_sends_the_hosts_model_and_cap(
    rewriting: tuple[ModelGateway, httpx.Client], fake: FakeAnthropic
) -> None:
    ok(fake)
    tools = [{"name": "t", "description": "d", "input_schema": {"type": "object", "properties": {"model": {}}}}]
    body = {"model": EXPENSIVE, "max_tokens": 100_000, "messages": MESSAGES, "tools": tools, "stream": False}
    assert post(rewriting[1], body).status_code == 200
    sent = fake.calls[0]
    assert sent.body == {**body, "model": MODEL, "max_tokens": CAP}
    assert list(sent.body) == list(body)  # the keys keep their order
    # Every other value is passed on as the container wrote it (never decoded and re-encoded).
    assert json.dumps(MESSAGES).encode() in sent.raw


@pytest.mark.parametrize(
    ("raw", "allowed"),
    [
        # msgspec (like the upstreams' JSON parsers) reads the last of duplicate keys.
        (b'{"model":"%s","max_tokens":8,"messages":[],"model":"%s"}' % (EXPENSIVE.encode(), MODEL.encode()), True),
        (b'{"model":"%s","max_tokens":8,"messages":[],"model":"%s"}' % (MODEL.encode(), EXPENSIVE.encode()), False),
        # A key spelled with escapes is the same key.
        (
            b'{"mod\\u0065l":"%s","max_tokens":8,"messages":[],"model":"%s"}' % (EXPENSIVE.encode(), MODEL.encode()),
            True,
        ),
        (
            b'{"model":"%s","max_tokens":8,"messages":[],"mod\\u0065l":"%s"}' % (MODEL.encode(), EXPENSIVE.encode()),
            False,
        ),
        (b'{"model":"%s","max_tokens":8,"max\\u005ftokens":100000,"messages":[]}' % MODEL.encode(), False),
    ],
)
def test_hidden_duplicates_reach_the_upstream_as_the_value_checked(
    refusing: tuple[ModelGateway, httpx.Client], fake: FakeAnthropic, raw: bytes, allowed: bool
) -> None:
    ok(fake)
    resp = post(refusing[1], raw)
    if not allowed:
        assert resp.status_code == 403, resp.text
        assert fake.calls == []
        return
    assert resp.status_code == 200, resp.text
    sent = fake.calls[0].raw
    # One copy of each key: whichever copy a parser keeps, it is the checked one.
    assert sent.count(b'"model"') == 1 and b"\\u0065" not in sent and EXPENSIVE.encode() not in sent
    assert fake.calls[0].body == {"model": MODEL, "max_tokens": 8, "messages": []}


@pytest.mark.parametrize("other", ["Model", "MODEL", "mod\u0045l", "modeL"])
def test_keys_only_a_case_blind_reader_takes_for_the_model_are_left_out(
    refusing: tuple[ModelGateway, httpx.Client], fake: FakeAnthropic, other: str
) -> None:
    # Go's encoding/json (Ollama's) matches keys ignoring case: "Model" would set the model there.
    ok(fake)
    body = {"model": MODEL, "max_tokens": 8, "messages": [], other: EXPENSIVE}
    assert post(refusing[1], body).status_code == 200
    assert fake.calls[0].body == {"model": MODEL, "max_tokens": 8, "messages": []}


def test_go_folded_characters_in_a_cap_key_are_left_out(
    refusing: tuple[ModelGateway, httpx.Client], fake: FakeAnthropic
) -> None:
    # Go folds the Kelvin sign to "k" and the long s to "s": both spell max_tokens for it.
    ok(fake)
    for key in ("max_to\u212aen\u017f", "MAX_TOKENS"):
        fake.replies.append(message([{"type": "text", "text": "ok"}], "end_turn"))
        assert post(refusing[1], {"model": MODEL, "max_tokens": 8, key: 100_000, "messages": []}).status_code == 200
    assert [c.body for c in fake.calls] == [{"model": MODEL, "max_tokens": 8, "messages": []}] * 2


def test_an_escaped_cap_over_the_hosts_is_rewritten_once(
    rewriting: tuple[ModelGateway, httpx.Client], fake: FakeAnthropic
) -> None:
    ok(fake)
    raw = b'{"max_tokens":8,"model":"%s","messages":[],"max\\u005ftokens":100000}' % MODEL.encode()
    assert post(rewriting[1], raw).status_code == 200
    sent = fake.calls[0].raw
    assert sent.count(b'"max_tokens"') == 1 and fake.calls[0].body["max_tokens"] == CAP


def test_a_hostile_body_needing_a_rewrite_is_refused_at_once(sock: Path, fake: FakeAnthropic) -> None:
    # A million top-level keys would cost seconds and hundreds of MB to rewrite.
    keys = b",".join(b'"k%d":0' % i for i in range(MAX_REWRITE_COLONS + 1))
    body = b'{"model":"%s",%s}' % (EXPENSIVE.encode(), keys)
    with fake.serve() as upstream, held(sock, upstream, "rewrite") as gw, client_for(sock) as client:
        t0 = time.monotonic()
        resp = post(client, body)
        took = time.monotonic() - t0
    assert resp.status_code == 413 and "rewrite" in resp.json()["error"]["message"]
    assert fake.calls == [] and gw.refused == 1
    assert took < 5


def test_the_budget_still_holds_under_the_cap(sock: Path, fake: FakeAnthropic) -> None:
    with fake.serve() as upstream, held(sock, upstream, "rewrite", token_budget=40) as gw, client_for(sock) as client:
        # rewritten to the cap (64), which is more than the 40 tokens left: the budget refuses it
        resp = post(client, {"model": MODEL, "max_tokens": 1000, "messages": MESSAGES})
        assert resp.status_code == 403 and resp.json()["error"]["type"] == "budget_exceeded"
        assert gw.budget_refusals == 1
        ok(fake)
        # no cap asked: the smaller of the host's cap and what is left
        assert post(client, {"model": MODEL, "messages": MESSAGES}).status_code == 200
    assert fake.requests[0]["max_tokens"] == 40


def test_openai_requests_are_held_to_the_model_and_cap(sock: Path) -> None:
    fake = FakeOpenAI(chat("ok"))
    with (
        fake.serve() as upstream,
        ModelGateway(
            sock,
            GatewayConfig(
                base_url=upstream,
                api_key="",
                route="openai",
                model="llama3.1:8b",
                max_tokens=CAP,
            ),
        ) as gw,
        client_for(sock) as client,
    ):
        refused = post(client, {"model": "gpt-4o", "messages": MESSAGES}, "/v1/chat/completions")
        assert refused.status_code == 403 and "'llama3.1:8b' only" in refused.json()["error"]["message"]
        over = post(
            client, {"model": "llama3.1:8b", "max_completion_tokens": 999, "messages": MESSAGES}, "/v1/chat/completions"
        )
        assert over.status_code == 403 and over.json()["error"]["type"] == "max_tokens_not_allowed"
        assert post(client, {"model": "llama3.1:8b", "messages": MESSAGES}, "/v1/chat/completions").status_code == 200
    assert fake.requests == [{"max_tokens": CAP, "model": "llama3.1:8b", "messages": MESSAGES}]
    assert gw.refused == 2


def test_the_settings_choose_the_model_cap_and_policy(sock: Path, fake: FakeAnthropic, tmp_path: Path) -> None:
    with fake.serve() as upstream:
        settings = Settings.load(
            env_file=None,
            environ={
                "ORCHESTRATOR_DATA_DIR": str(tmp_path),
                "ORCHESTRATOR_MODEL": f"anthropic:{MODEL}",
                "ORCHESTRATOR_MAX_TOKENS": "200",
                "ORCHESTRATOR_GATEWAY_MODEL_POLICY": "rewrite",
                "ORCHESTRATOR_ANTHROPIC_BASE_URL": upstream,
                "ORCHESTRATOR_ANTHROPIC_API_KEY": KEY,
            },
        )
        with ModelGateway.for_provider(sock, settings, "anthropic") as gw:
            assert (gw.config.model, gw.config.max_tokens, gw.config.model_policy) == (MODEL, 200, "rewrite")
        # The pipeline passes the run's recorded model and cap, which win.
        with ModelGateway.for_provider(sock, settings, "anthropic", model="claude-other", max_tokens=10) as gw:
            assert (gw.config.model, gw.config.max_tokens) == ("claude-other", 10)
        # A provider the model setting does not name: no model to hold to, the cap still holds.
        with ModelGateway.for_provider(sock, settings, "openai") as gw:
            assert (gw.config.model, gw.config.max_tokens) == (None, 200)
    with pytest.raises(Exception, match="GATEWAY_MODEL_POLICY"):
        Settings.load(env_file=None, environ={"ORCHESTRATOR_GATEWAY_MODEL_POLICY": "allow"})


def test_the_real_sdk_asking_for_another_model_gets_a_clear_final_error(sock: Path, fake: FakeAnthropic) -> None:
    """What a container's runner sees: the Anthropic SDK through the socket, not retried."""
    with fake.serve() as upstream, held(sock, upstream):
        provider = AnthropicProvider(
            ModelSettings(provider="anthropic", model=EXPENSIVE, max_tokens=16, socket_path=str(sock))
        )
        with pytest.raises(ProviderError) as raised:
            provider.complete("system", [ProviderMessage("user", [TextBlock("hi")])], [])
    assert raised.value.retryable is False and raised.value.status_code == 403
    assert f"may use the model '{MODEL}' only" in str(raised.value)
    assert fake.calls == []


def test_cache_tokens_are_counted_apart_and_carried_over(sock: Path, fake: FakeAnthropic) -> None:
    fake.replies.append(message([{"type": "text", "text": "ok"}], "end_turn", n=2, cache_creation=7, cache_read=30))
    spent = Usage(input_tokens=5, output_tokens=1, cache_read_input_tokens=3)
    with fake.serve() as upstream, held(sock, upstream, spent=spent) as gw, client_for(sock) as client:
        assert post(client, {"model": MODEL, "max_tokens": 8, "messages": MESSAGES}).status_code == 200
    assert gw.usage == Usage(
        input_tokens=5 + 20 + 7 + 30, output_tokens=1 + 2, cache_read_input_tokens=3 + 30, cache_creation_input_tokens=7
    )
    assert msgspec.json.decode(msgspec.json.encode(gw.usage), type=Usage) == gw.usage
