"""The gateway forwards only what is allowed: headers, betas, fields and tools on its lists.

The real ModelGateway on a unix socket; its upstream a fake on loopback that
records every request it gets, whatever its route.  A request that would have
the provider's servers reach the network (MCP servers, server tools such as
web_fetch and web_search, a beta that turns them on) or another model
(OpenRouter's models/route, fallbacks), or that names any field not on the
list, is refused with a 403 that says why, and the upstream never sees it; an
allowed request still passes, without its query string or the headers not
on the list.
"""

from __future__ import annotations

import json
import socket
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from orchestrator.sandbox.gateway import (
    ANTHROPIC_BETAS,
    ANTHROPIC_HEADERS,
    OPENAI_HEADERS,
    OPENAI_PATHS,
    ModelGateway,
)
from tests.fakes.anthropic_api import FakeAnthropic, message
from tests.fakes.openai_api import FakeOpenAI, chat

KEY = "sk-allowlist-key"
MODEL = "claude-sonnet-4-5"
MESSAGES = [{"role": "user", "content": "hi"}]
BASE = {"model": MODEL, "max_tokens": 64, "messages": MESSAGES}
CUSTOM = {"name": "bash", "description": "run a command", "input_schema": {"type": "object", "properties": {}}}
WEB_FETCH = {"type": "web_fetch_20250910", "name": "web_fetch", "max_uses": 5}
WEB_SEARCH = {"type": "web_search_20250305", "name": "web_search", "max_uses": 5}
MCP = [{"type": "url", "url": "https://attacker.example/sse", "name": "exfil"}]
FUNCTION = {"type": "function", "function": {"name": "bash", "parameters": {"type": "object", "properties": {}}}}


@pytest.fixture
def sock(tmp_path: Path) -> Path:
    return tmp_path / "g" / "model.sock"


def client_for(path: Path) -> httpx.Client:
    return httpx.Client(transport=httpx.HTTPTransport(uds=str(path)), base_url="http://gateway", timeout=10)


@pytest.fixture
def anthropic(sock: Path) -> Iterator[tuple[ModelGateway, httpx.Client, FakeAnthropic]]:
    fake = FakeAnthropic()
    with fake.serve() as upstream, \
            ModelGateway(sock, upstream=upstream, api_key=KEY, model=MODEL, max_tokens=1024) as gw, \
            client_for(sock) as client:
        yield gw, client, fake


@pytest.fixture
def openai(sock: Path) -> Iterator[tuple[ModelGateway, httpx.Client, FakeOpenAI]]:
    fake = FakeOpenAI()
    with fake.serve() as upstream, \
            ModelGateway(sock, upstream=upstream, api_key=KEY, allowed_paths=OPENAI_PATHS, auth="bearer",
                         model="llama3.1:8b", max_tokens=1024) as gw, \
            client_for(sock) as client:
        yield gw, client, fake


def post(client: httpx.Client, body: bytes | dict[str, Any], path: str = "/v1/messages",
         headers: dict[str, str] | None = None) -> httpx.Response:
    data = body if isinstance(body, bytes) else json.dumps(body).encode()
    return client.post(path, content=data, headers={"content-type": "application/json", **(headers or {})})


def refused(resp: httpx.Response, kind: str, *said: str) -> None:
    assert resp.status_code == 403, resp.text
    error = resp.json()["error"]
    assert error["type"] == kind, error
    for words in said:
        assert words in error["message"], error["message"]


# -- the Messages API -----------------------------------------------------------------------------

@pytest.mark.parametrize(
    ("body", "kind", "said"),
    [
        ({**BASE, "mcp_servers": MCP}, "field_not_allowed", ("'mcp_servers'", "MCP servers at any URL")),
        # A key spelled with an escape, or in another case, is the same key to a reader that unescapes
        # or ignores case: neither is on the list.
        (b'{"model":"%s","max_tokens":64,"messages":[],"mcp\\u005fservers":%s}' % (MODEL.encode(),
                                                                                json.dumps(MCP).encode()),
         "field_not_allowed", ("'mcp_servers'",)),
        ({**BASE, "MCP_servers": MCP}, "field_not_allowed", ("'MCP_servers'", "not on the gateway's list")),
        ({**BASE, "container": "container_011CQ"}, "field_not_allowed", ("'container'", "code-execution")),
        ({**BASE, "fallbacks": [{"model": "claude-opus-4-1"}]}, "field_not_allowed", ("'fallbacks'", "other models")),
        ({**BASE, "speed": "fast"}, "field_not_allowed", ("'speed'", "allowed: cache_control, context_management")),
        ({**BASE, "n": 1}, "field_not_allowed", ("Messages API field 'n'",)),  # Chat Completions' own
        ({**BASE, "tools": [CUSTOM, WEB_FETCH]}, "tool_not_allowed", ("tools[1]", "'web_fetch_20250910'")),
        ({**BASE, "tools": [WEB_SEARCH]}, "tool_not_allowed", ("tools[0]", "'web_search_20250305'",
                                                               "no type or 'custom'")),
        ({**BASE, "tools": [{"type": "code_execution_20250825", "name": "code_execution"}]}, "tool_not_allowed",
         ("'code_execution_20250825'",)),
        ({**BASE, "tools": [{"type": "mcp_toolset", "mcp_server_name": "exfil"}]}, "tool_not_allowed",
         ("'mcp_toolset'",)),
        # The type a case-blind reader would take, and an escaped one.
        ({**BASE, "tools": [{**CUSTOM, "Type": "web_fetch_20250910"}]}, "tool_not_allowed", ("'Type'",)),
        (b'{"model":"%s","max_tokens":64,"messages":[],"tools":[{"name":"w","typ\\u0065":"web_fetch_20250910"}]}'
         % MODEL.encode(), "tool_not_allowed", ("'web_fetch_20250910'",)),
    ],
)
def test_what_would_reach_the_network_or_another_model_is_refused(
    anthropic: tuple[ModelGateway, httpx.Client, FakeAnthropic], body: bytes | dict[str, Any], kind: str,
    said: tuple[str, ...],
) -> None:
    gw, client, fake = anthropic
    refused(post(client, body), kind, *said)
    assert fake.calls == [] and gw.requests == 0 and gw.refused == 1


@pytest.mark.parametrize(
    ("headers", "value"),
    [
        ({"anthropic-beta": "mcp-client-2025-11-20"}, "mcp-client-2025-11-20"),
        ({"anthropic-beta": "claude-code-20250219, web-fetch-2025-09-10"}, "web-fetch-2025-09-10"),
        ({"anthropic-beta": "CLAUDE-CODE-20250219"}, "CLAUDE-CODE-20250219"),
    ],
)
def test_a_beta_not_on_the_list_is_refused_saying_which(
    anthropic: tuple[ModelGateway, httpx.Client, FakeAnthropic], headers: dict[str, str], value: str
) -> None:
    gw, client, fake = anthropic
    refused(post(client, BASE, headers=headers), "beta_not_allowed", f"anthropic-beta value {value!r}")
    assert fake.calls == [] and gw.requests == 0


def test_every_line_of_the_beta_header_is_read(sock: Path) -> None:
    # Two header lines: a forwarder that kept one (the last, as a dict does) checked the other
    # while the upstream may have read both.
    fake = FakeAnthropic()
    raw = json.dumps(BASE).encode()
    with fake.serve() as upstream, ModelGateway(sock, upstream=upstream, api_key=KEY) as gw:
        with socket.socket(socket.AF_UNIX) as conn:
            conn.settimeout(5)
            conn.connect(str(sock))
            conn.sendall(b"POST /v1/messages HTTP/1.1\r\nHost: gateway\r\nanthropic-beta: mcp-client-2025-04-04\r\n"
                         b"anthropic-beta: claude-code-20250219\r\nContent-Length: %d\r\n\r\n%s" % (len(raw), raw))
            answer = b""
            while chunk := conn.recv(65536):
                answer += chunk
    assert answer.startswith(b"HTTP/1.1 403") and b"mcp-client-2025-04-04" in answer, answer[:300]
    assert fake.calls == [] and gw.requests == 0


def test_an_allowed_request_passes_without_its_query_string_or_unlisted_headers(
    anthropic: tuple[ModelGateway, httpx.Client, FakeAnthropic]
) -> None:
    gw, client, fake = anthropic
    fake.replies.append(message([{"type": "text", "text": "ok"}], "end_turn"))
    body = json.dumps({**BASE, "tools": [CUSTOM, {**CUSTOM, "name": "other", "type": "custom"}],
                       "thinking": {"type": "enabled", "budget_tokens": 1024}, "metadata": {"user_id": "u"},
                       "context_management": {"edits": []}, "stream": False}).encode()
    sent = {
        "anthropic-version": "2023-06-01", "anthropic-beta": "claude-code-20250219 , interleaved-thinking-2025-05-14",
        "x-app": "cli", "x-stainless-os": "Linux", "user-agent": "claude-cli/2.1.332 (external, sdk-py)",
        # Not on the list: dropped, never refused.
        "x-evil": "1", "cookie": "a=b", "x-forwarded-for": "10.0.0.1", "anthropic-organization-id": "org",
        "x-api-key": "from-the-sandbox",
    }
    resp = post(client, body, "/v1/messages?beta=true&redirect=https://attacker.example", headers=sent)

    assert resp.status_code == 200, resp.text
    (call,) = fake.calls
    assert call.path == "/v1/messages"  # the query string is not passed on
    assert call.raw == body  # the body byte for byte
    assert call.headers["anthropic-beta"] == "claude-code-20250219,interleaved-thinking-2025-05-14"
    assert {name: call.headers[name] for name in ("anthropic-version", "x-app", "x-stainless-os", "user-agent")} == {
        name: sent[name] for name in ("anthropic-version", "x-app", "x-stainless-os", "user-agent")}
    assert call.headers["x-api-key"] == KEY
    # Nothing else but what the gateway's own client adds (the framing, its encodings).
    assert set(call.headers) - ANTHROPIC_HEADERS <= {"host", "content-length", "x-api-key", "accept-encoding",
                                                     "connection"}, call.headers
    assert gw.refused == 0


def test_the_recorded_lists_are_the_clis(anthropic: tuple[ModelGateway, httpx.Client, FakeAnthropic]) -> None:
    # Every recorded header and beta passes at once, as the CLI sends them.
    gw, client, fake = anthropic
    fake.replies.append(message([{"type": "text", "text": "ok"}], "end_turn"))
    headers = {name: "v" for name in ANTHROPIC_HEADERS} | {"anthropic-beta": ",".join(sorted(ANTHROPIC_BETAS)),
                                                          "content-type": "application/json"}
    assert post(client, BASE, "/v1/messages?beta=true", headers=headers).status_code == 200
    (call,) = fake.calls
    assert ANTHROPIC_HEADERS <= set(call.headers) and call.path == "/v1/messages"


def test_a_hidden_second_tools_key_reaches_the_upstream_as_the_one_checked(
    anthropic: tuple[ModelGateway, httpx.Client, FakeAnthropic]
) -> None:
    # msgspec (and the upstream) read the last of duplicate keys; a reader that kept the first
    # would get the server tool: the upstream gets one copy, the checked one.
    gw, client, fake = anthropic
    fake.replies.extend(message([{"type": "text", "text": "ok"}], "end_turn") for _ in range(2))
    head = b'{"model":"%s","max_tokens":64,"messages":[],' % MODEL.encode()
    for hidden in (b'"tools":[%s],"tools":[%s]}', b'"t\\u006fols":[%s],"tools":[%s]}'):
        body = head + hidden % (json.dumps(WEB_SEARCH).encode(), json.dumps(CUSTOM).encode())
        assert post(client, body).status_code == 200
    for call in fake.calls:
        assert call.raw.count(b'"tools"') == 1 and b"web_search" not in call.raw, call.raw
        assert call.body["tools"] == [CUSTOM]
    # The other way round, the server tool is the one read: refused.
    body = head + b'"tools":[%s],"tools":[%s]}' % (json.dumps(CUSTOM).encode(), json.dumps(WEB_SEARCH).encode())
    refused(post(client, body), "tool_not_allowed", "'web_search_20250305'")
    assert len(fake.calls) == 2


def test_a_hostile_list_of_tools_is_refused_at_once(anthropic: tuple[ModelGateway, httpx.Client, FakeAnthropic]) -> None:
    # Two million tiny tools: read one by one, they would cost ~140 MB and a fifth of a second.
    gw, client, fake = anthropic
    body = b'{"model":"%s","max_tokens":64,"messages":[],"tools":[%s{}]}' % (MODEL.encode(), b"{}," * 2_000_000)
    t0 = time.monotonic()
    resp = post(client, body)
    assert resp.status_code == 413 and "tools" in resp.json()["error"]["message"], resp.text
    assert time.monotonic() - t0 < 2
    assert fake.calls == [] and gw.requests == 0


# -- OpenAI-compatible servers -------------------------------------------------------------------

@pytest.mark.parametrize(
    ("extra", "kind", "said"),
    [
        ({"models": ["openai/gpt-4o", "anthropic/claude-opus-4.1"]}, "field_not_allowed", ("'models'", "other models")),
        ({"route": "fallback"}, "field_not_allowed", ("'route'", "another model")),
        ({"fallbacks": [{"model": "gpt-4o"}]}, "field_not_allowed", ("'fallbacks'",)),
        ({"plugins": [{"id": "web"}]}, "field_not_allowed", ("'plugins'", "reach the network")),
        ({"web_search_options": {}}, "field_not_allowed", ("'web_search_options'", "search the web")),
        ({"provider": {"order": ["x"]}}, "field_not_allowed", ("Chat Completions field 'provider'",)),
        ({"tools": [FUNCTION, {"type": "web_search"}]}, "tool_not_allowed", ("tools[1]", "'web_search'",
                                                                              "'function'")),
        ({"tools": [{"function": FUNCTION["function"]}]}, "tool_not_allowed", ("of type None",)),
    ],
)
def test_openai_fields_and_tools_not_on_the_list_are_refused(
    openai: tuple[ModelGateway, httpx.Client, FakeOpenAI], extra: dict[str, Any], kind: str, said: tuple[str, ...]
) -> None:
    gw, client, fake = openai
    body = {"model": "llama3.1:8b", "messages": MESSAGES, **extra}
    refused(post(client, body, "/v1/chat/completions"), kind, *said)
    assert fake.calls == [] and gw.requests == 0


def test_an_allowed_openai_request_passes_with_the_listed_headers_only(
    openai: tuple[ModelGateway, httpx.Client, FakeOpenAI]
) -> None:
    gw, client, fake = openai
    fake.replies.append(chat("ok"))
    body = json.dumps({"model": "llama3.1:8b", "messages": MESSAGES, "tools": [FUNCTION], "max_tokens": 64}).encode()
    headers = {"accept": "application/json", "anthropic-beta": "mcp-client-2025-04-04", "openai-organization": "o",
               "x-evil": "1"}
    assert post(client, body, "/v1/chat/completions?api-version=1", headers=headers).status_code == 200
    (call,) = fake.calls
    assert call.path == "/v1/chat/completions" and call.raw == body
    assert call.headers["authorization"] == f"Bearer {KEY}"
    assert set(call.headers) - OPENAI_HEADERS <= {"host", "content-length", "authorization", "accept-encoding",
                                                  "connection"}, call.headers
