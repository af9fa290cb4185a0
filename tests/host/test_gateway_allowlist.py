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

import contextlib
import json
import socket
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from fakes.anthropic_api import FakeAnthropic, message
from fakes.openai_api import FakeOpenAI, chat
from orchestrator.sandbox.egress_policy import EgressPolicy, opened_tools, parse_network_option, search_domains
from orchestrator.sandbox.gateway import (
    ANTHROPIC_BETAS,
    ANTHROPIC_HEADERS,
    OPENAI_HEADERS,
    GatewayConfig,
    ModelGateway,
)

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
    with (
        fake.serve() as upstream,
        ModelGateway(sock, GatewayConfig(base_url=upstream, api_key=KEY, model=MODEL, max_tokens=1024)) as gw,
        client_for(sock) as client,
    ):
        yield gw, client, fake


@pytest.fixture
def openai(sock: Path) -> Iterator[tuple[ModelGateway, httpx.Client, FakeOpenAI]]:
    fake = FakeOpenAI()
    with (
        fake.serve() as upstream,
        ModelGateway(
            sock,
            GatewayConfig(
                base_url=upstream,
                api_key=KEY,
                route="openai",
                model="llama3.1:8b",
                max_tokens=1024,
            ),
        ) as gw,
        client_for(sock) as client,
    ):
        yield gw, client, fake


def post(
    client: httpx.Client,
    body: bytes | dict[str, Any],
    path: str = "/v1/messages",
    headers: dict[str, str] | None = None,
) -> httpx.Response:
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
        (
            b'{"model":"%s","max_tokens":64,"messages":[],"mcp\\u005fservers":%s}'
            % (MODEL.encode(), json.dumps(MCP).encode()),
            "field_not_allowed",
            ("'mcp_servers'",),
        ),
        ({**BASE, "MCP_servers": MCP}, "field_not_allowed", ("'MCP_servers'", "not on the gateway's list")),
        ({**BASE, "container": "container_011CQ"}, "field_not_allowed", ("'container'", "code-execution")),
        ({**BASE, "fallbacks": [{"model": "claude-opus-4-1"}]}, "field_not_allowed", ("'fallbacks'", "other models")),
        ({**BASE, "speed": "fast"}, "field_not_allowed", ("'speed'", "allowed: cache_control, context_management")),
        ({**BASE, "n": 1}, "field_not_allowed", ("Messages API field 'n'",)),  # Chat Completions' own
        ({**BASE, "tools": [CUSTOM, WEB_FETCH]}, "tool_not_allowed", ("tools[1]", "'web_fetch_20250910'")),
        (
            {**BASE, "tools": [WEB_SEARCH]},
            "tool_not_allowed",
            ("tools[0]", "'web_search_20250305'", "no type or 'custom'"),
        ),
        (
            {**BASE, "tools": [{"type": "code_execution_20250825", "name": "code_execution"}]},
            "tool_not_allowed",
            ("'code_execution_20250825'",),
        ),
        (
            {**BASE, "tools": [{"type": "mcp_toolset", "mcp_server_name": "exfil"}]},
            "tool_not_allowed",
            ("'mcp_toolset'",),
        ),
        # The type a case-blind reader would take, and an escaped one.
        ({**BASE, "tools": [{**CUSTOM, "Type": "web_fetch_20250910"}]}, "tool_not_allowed", ("'Type'",)),
        (
            b'{"model":"%s","max_tokens":64,"messages":[],"tools":[{"name":"w","typ\\u0065":"web_fetch_20250910"}]}'
            % MODEL.encode(),
            "tool_not_allowed",
            ("'web_fetch_20250910'",),
        ),
    ],
)
def test_what_would_reach_the_network_or_another_model_is_refused(
    anthropic: tuple[ModelGateway, httpx.Client, FakeAnthropic],
    body: bytes | dict[str, Any],
    kind: str,
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
    with fake.serve() as upstream, ModelGateway(sock, GatewayConfig(base_url=upstream, api_key=KEY)) as gw:
        with socket.socket(socket.AF_UNIX) as conn:
            conn.settimeout(5)
            conn.connect(str(sock))
            conn.sendall(
                b"POST /v1/messages HTTP/1.1\r\nHost: gateway\r\nanthropic-beta: mcp-client-2025-04-04\r\n"
                b"anthropic-beta: claude-code-20250219\r\nContent-Length: %d\r\n\r\n%s" % (len(raw), raw)
            )
            answer = b""
            while chunk := conn.recv(65536):
                answer += chunk
    assert answer.startswith(b"HTTP/1.1 403") and b"mcp-client-2025-04-04" in answer, answer[:300]
    assert fake.calls == [] and gw.requests == 0


def test_an_allowed_request_passes_without_its_query_string_or_unlisted_headers(
    anthropic: tuple[ModelGateway, httpx.Client, FakeAnthropic],
) -> None:
    gw, client, fake = anthropic
    fake.replies.append(message([{"type": "text", "text": "ok"}], "end_turn"))
    body = json.dumps(
        {
            **BASE,
            "tools": [CUSTOM, {**CUSTOM, "name": "other", "type": "custom"}],
            "thinking": {"type": "enabled", "budget_tokens": 1024},
            "metadata": {"user_id": "u"},
            "context_management": {"edits": []},
            "stream": False,
        }
    ).encode()
    sent = {
        "anthropic-version": "2023-06-01",
        "anthropic-beta": "claude-code-20250219 , interleaved-thinking-2025-05-14",
        "x-app": "cli",
        "x-stainless-os": "Linux",
        "user-agent": "claude-cli/2.1.332 (external, sdk-py)",
        # Not on the list: dropped, never refused.
        "x-evil": "1",
        "cookie": "a=b",
        "x-forwarded-for": "10.0.0.1",
        "anthropic-organization-id": "org",
        "x-api-key": "from-the-sandbox",
    }
    resp = post(client, body, "/v1/messages?beta=true&redirect=https://attacker.example", headers=sent)

    assert resp.status_code == 200, resp.text
    (call,) = fake.calls
    assert call.path == "/v1/messages"  # the query string is not passed on
    assert call.raw == body  # the body byte for byte
    assert call.headers["anthropic-beta"] == "claude-code-20250219,interleaved-thinking-2025-05-14"
    assert {name: call.headers[name] for name in ("anthropic-version", "x-app", "x-stainless-os", "user-agent")} == {
        name: sent[name] for name in ("anthropic-version", "x-app", "x-stainless-os", "user-agent")
    }
    assert call.headers["x-api-key"] == KEY
    # Nothing else but what the gateway's own client adds (the framing, its encodings).
    assert set(call.headers) - ANTHROPIC_HEADERS <= {
        "host",
        "content-length",
        "x-api-key",
        "accept-encoding",
        "connection",
    }, call.headers
    assert gw.refused == 0


def test_the_recorded_lists_are_the_clis(anthropic: tuple[ModelGateway, httpx.Client, FakeAnthropic]) -> None:
    # Every recorded header and beta passes at once, as the CLI sends them.
    gw, client, fake = anthropic
    fake.replies.append(message([{"type": "text", "text": "ok"}], "end_turn"))
    headers = {name: "v" for name in ANTHROPIC_HEADERS} | {
        "anthropic-beta": ",".join(sorted(ANTHROPIC_BETAS)),
        "content-type": "application/json",
    }
    assert post(client, BASE, "/v1/messages?beta=true", headers=headers).status_code == 200
    (call,) = fake.calls
    assert ANTHROPIC_HEADERS <= set(call.headers) and call.path == "/v1/messages"


def test_a_hidden_second_tools_key_reaches_the_upstream_as_the_one_checked(
    anthropic: tuple[ModelGateway, httpx.Client, FakeAnthropic],
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


def test_a_hostile_list_of_tools_is_refused_at_once(
    anthropic: tuple[ModelGateway, httpx.Client, FakeAnthropic],
) -> None:
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
        ({"tools": [FUNCTION, {"type": "web_search"}]}, "tool_not_allowed", ("tools[1]", "'web_search'", "'function'")),
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
    openai: tuple[ModelGateway, httpx.Client, FakeOpenAI],
) -> None:
    gw, client, fake = openai
    fake.replies.append(chat("ok"))
    body = json.dumps({"model": "llama3.1:8b", "messages": MESSAGES, "tools": [FUNCTION], "max_tokens": 64}).encode()
    headers = {
        "accept": "application/json",
        "anthropic-beta": "mcp-client-2025-04-04",
        "openai-organization": "o",
        "x-evil": "1",
    }
    assert post(client, body, "/v1/chat/completions?api-version=1", headers=headers).status_code == 200
    (call,) = fake.calls
    assert call.path == "/v1/chat/completions" and call.raw == body
    assert call.headers["authorization"] == f"Bearer {KEY}"
    assert set(call.headers) - OPENAI_HEADERS <= {
        "host",
        "content-length",
        "authorization",
        "accept-encoding",
        "connection",
    }, call.headers


# -- sources in messages: what the provider would fetch ------------------------------------------

URL_IMAGE: dict[str, Any] = {
    "type": "image",
    "source": {"type": "url", "url": "https://attacker.example/x.png?leak=secret"},
}
BASE64_IMAGE: dict[str, Any] = {
    "type": "image",
    "source": {"type": "base64", "media_type": "image/png", "data": "iVBORw0KGgo="},
}
TEXT_DOCUMENT: dict[str, Any] = {
    "type": "document",
    "source": {"type": "text", "media_type": "text/plain", "data": "https://example.com is a link, not a source"},
}


def asking(*blocks: dict[str, Any]) -> dict[str, Any]:
    """BASE with a user message of ``blocks`` after its first one."""
    return {**BASE, "messages": [*MESSAGES, {"role": "user", "content": list(blocks)}]}


def tool_result(*blocks: dict[str, Any]) -> dict[str, Any]:
    return {"type": "tool_result", "tool_use_id": "toolu_1", "content": list(blocks)}


def spelled(body: dict[str, Any], *respellings: tuple[bytes, bytes]) -> bytes:
    """``body`` as JSON, with keys or values spelled otherwise (escapes, another case)."""
    raw = json.dumps(body).encode()
    for plain, other in respellings:
        assert plain in raw
        raw = raw.replace(plain, other)
    return raw


@pytest.mark.parametrize(
    ("body", "where", "said"),
    [
        (asking(URL_IMAGE), "messages[1].content[0]", ("source is of type 'url'", "https://attacker.example/x.png")),
        (
            asking(
                {"type": "text", "text": "see"},
                {"type": "document", "source": {"type": "url", "url": "https://attacker.example/d.pdf"}},
            ),
            "messages[1].content[1]",
            ("'url'",),
        ),
        (
            asking({"type": "document", "source": {"type": "file", "file_id": "file_011CNha8iCJcU1wXNR6q4V8w"}}),
            "messages[1].content[0]",
            ("of type 'file'", "stored at the provider"),
        ),
        # Nested: in a tool result, and in a document whose source is a list of blocks.
        (
            asking(tool_result({"type": "text", "text": "here"}, URL_IMAGE)),
            "messages[1].content[0].content[1]",
            ("'url'",),
        ),
        (
            asking({"type": "document", "source": {"type": "content", "content": [URL_IMAGE]}}),
            "messages[1].content[0].source.content[0]",
            ("'url'",),
        ),
        (
            asking(
                tool_result({"type": "document", "source": {"type": "content", "content": [tool_result(URL_IMAGE)]}})
            ),
            "messages[1].content[0].content[0].source.content[0].content[0]",
            ("'url'",),
        ),
        # An inline type with a URL beside it, a file beside a block, a source of no inline type.
        (
            asking({"type": "image", "source": {**BASE64_IMAGE["source"], "url": "https://attacker.example/"}}),
            "messages[1].content[0]",
            ("base64 source has a 'url' key",),
        ),
        (asking({"type": "container_upload", "file_id": "file_011"}), "messages[1].content[0]", ("'file_id'",)),
        (
            asking({"type": "image", "source": {"media_type": "image/png", "url": "https://attacker.example/"}}),
            "messages[1].content[0]",
            ("of type None",),
        ),
        # Escaped, the key and the type are what the upstream reads (it unescapes them).
        (spelled(asking(URL_IMAGE), (b'"source"', b'"sourc\\u0065"')), "messages[1].content[0]", ("'url'",)),
        (spelled(asking(URL_IMAGE), (b'"type": "url"', b'"type": "\\u0075rl"')), "messages[1].content[0]", ("'url'",)),
        (
            spelled(
                asking(tool_result(URL_IMAGE)), (b'"content": [{"type": "image"', b'"c\\u006fntent": [{"type": "image"')
            ),
            "messages[1].content[0].content[0]",
            ("'url'",),
        ),
    ],
    ids=[
        "url-image",
        "url-document",
        "file-document",
        "in-tool-result",
        "in-content-source",
        "deep",
        "url-beside-base64",
        "file-id",
        "no-type",
        "escaped-key",
        "escaped-type",
        "escaped-content-key",
    ],
)
def test_a_source_the_provider_would_fetch_is_refused_saying_where(
    anthropic: tuple[ModelGateway, httpx.Client, FakeAnthropic],
    body: bytes | dict[str, Any],
    where: str,
    said: tuple[str, ...],
) -> None:
    gw, client, fake = anthropic
    refused(post(client, body), "source_not_allowed", f"does not forward {where}:", *said)
    assert fake.calls == [] and gw.requests == 0 and gw.refused == 1


@pytest.mark.parametrize(
    ("body", "where"),
    [
        (spelled(asking(URL_IMAGE), (b'"source"', b'"Source"')), "messages[1].content[0]"),
        (spelled(asking(URL_IMAGE), (b'"source"', b'"\\u0053ource"')), "messages[1].content[0]"),
        (
            spelled(asking(URL_IMAGE), (b'"source"', '"\u017fource"'.encode()), (b'"url": "https', b'"URL": "https')),
            "messages[1].content[0]",
        ),
        # Blocks only a case-blind reader finds: under "Content".
        (
            spelled(asking(tool_result(URL_IMAGE)), (b'"content": [{"type": "image"', b'"CONTENT": [{"type": "image"')),
            "messages[1].content[0].content[0]",
        ),
        # A hidden second source: an exact reader takes "source", Go's encoding/json the last of the two.
        (spelled(asking({**URL_IMAGE, "SOURCE": BASE64_IMAGE["source"]})), "messages[1].content[0]"),
        (spelled(asking({**BASE64_IMAGE, "SOURCE": URL_IMAGE["source"]})), "messages[1].content[0]"),
    ],
    ids=["Source", "escaped-Source", "long-s-and-URL", "CONTENT", "url-then-SOURCE", "base64-then-SOURCE"],
)
def test_a_source_key_in_another_case_is_read_as_a_case_blind_reader_reads_it(
    anthropic: tuple[ModelGateway, httpx.Client, FakeAnthropic], body: bytes, where: str
) -> None:
    # Go's encoding/json (Ollama, relays in front of providers) matches keys ignoring case, and
    # folds the long s to "s": what it would read is refused as such.
    gw, client, fake = anthropic
    refused(post(client, body), "source_not_allowed", f"does not forward {where}:", "'url'")
    assert fake.calls == [] and gw.requests == 0


def test_inline_sources_pass_and_a_url_beside_them_is_refused(
    anthropic: tuple[ModelGateway, httpx.Client, FakeAnthropic],
) -> None:
    gw, client, fake = anthropic
    fake.replies.append(message([{"type": "text", "text": "ok"}], "end_turn"))
    inline = [
        BASE64_IMAGE,
        TEXT_DOCUMENT,
        {"type": "document", "source": {"type": "content", "content": [{"type": "text", "text": "a"}, BASE64_IMAGE]}},
        tool_result({"type": "text", "text": "a screenshot"}, BASE64_IMAGE),
        # A search result's source names where its text came from: nothing fetches it.
        {
            "type": "search_result",
            "source": "https://example.com/page",
            "title": "t",
            "content": [{"type": "text", "text": "found"}],
        },
        # Keys in a tool's input, or text, are the agent's data: never read for sources; nor is
        # text that only looks like an escape ("\\u0053" is a backslash and "u0053"), or
        # has a character Go folds to a letter (the long s).
        {"type": "text", "text": '{"type": "image", "source": {"type": "url", "url": "https://example.com"}}'},
        {"type": "text", "text": '{"\\u0053ource": {"type": "url"}} is how JSON escapes an S; Wa\u017f\u017fer'},
    ]
    calls = [
        {
            "role": "assistant",
            "content": [
                {
                    "type": "tool_use",
                    "id": "toolu_2",
                    "name": "WebFetch",
                    "input": {"url": "https://example.com", "source": {"type": "url", "url": "https://example.com"}},
                }
            ],
        }
    ]
    body = json.dumps({**BASE, "messages": [*MESSAGES, *calls, {"role": "user", "content": inline}]}).encode()
    assert post(client, body).status_code == 200
    (call,) = fake.calls
    assert call.body == json.loads(body)  # (the top level written anew: the text looks escaped)
    unsafe = json.dumps(asking(*inline, tool_result(BASE64_IMAGE, URL_IMAGE))).encode()
    refused(post(client, unsafe), "source_not_allowed", f"messages[1].content[{len(inline)}].content[1]")
    assert len(fake.calls) == 1


def test_a_long_session_passes_and_a_url_at_its_end_is_refused(
    anthropic: tuple[ModelGateway, httpx.Client, FakeAnthropic],
) -> None:
    # A Claude Code session of ~2.7 MB: 300 turns of a tool call and its output, a screenshot
    # and a WebFetch call (source keys: the messages are read), then the same with a URL image.
    gw, client, fake = anthropic
    fake.replies.append(message([{"type": "text", "text": "ok"}], "end_turn"))
    turns: list[dict[str, Any]] = []
    for i in range(300):
        turns.append(
            {
                "role": "assistant",
                "content": [
                    {"type": "text", "text": "Let me look."},
                    {"type": "tool_use", "id": f"toolu_{i}", "name": "Bash", "input": {"command": f"cat src/m{i}.py"}},
                ],
            }
        )
        turns.append(
            {
                "role": "user",
                "content": [
                    {
                        "type": "tool_result",
                        "tool_use_id": f"toolu_{i}",
                        "content": "def f(x):\n    return {'a': x}  # café\n" * 200,
                    }
                ],
            }
        )
    turns.append(
        {
            "role": "assistant",
            "content": [
                {
                    "type": "tool_use",
                    "id": "toolu_web",
                    "name": "WebFetch",
                    "input": {"url": "https://example.com", "prompt": "read"},
                }
            ],
        }
    )
    turns.append(
        {
            "role": "user",
            "content": [
                tool_result({"type": "text", "text": "no network"}),
                tool_result({**BASE64_IMAGE, "source": {**BASE64_IMAGE["source"], "data": "iVBORw0KGgo=" * 20_000}}),
            ],
        }
    )
    session: dict[str, Any] = {**BASE, "messages": [*MESSAGES, *turns]}
    body = json.dumps(session, ensure_ascii=False).encode()
    assert len(body) > 2_500_000
    assert post(client, body).status_code == 200
    assert fake.calls[0].raw == body
    session["messages"] += [
        {"role": "assistant", "content": [{"type": "text", "text": "ok"}]},
        {"role": "user", "content": [URL_IMAGE]},
    ]
    refused(post(client, json.dumps(session).encode()), "source_not_allowed", "messages[604].content[0]")
    assert len(fake.calls) == 1


def test_a_hidden_second_messages_key_reaches_the_upstream_as_the_one_checked(
    anthropic: tuple[ModelGateway, httpx.Client, FakeAnthropic],
) -> None:
    # msgspec (and the upstream) read the last of duplicate keys; a reader that kept the first
    # would get the URL image: the upstream gets one copy, the checked one.
    gw, client, fake = anthropic
    fake.replies.append(message([{"type": "text", "text": "ok"}], "end_turn"))
    hidden = json.dumps([{"role": "user", "content": [URL_IMAGE]}]).encode()
    body = b'{"model":"%s","max_tokens":64,"messages":%s,"messages":%s}' % (
        MODEL.encode(),
        hidden,
        json.dumps(MESSAGES).encode(),
    )
    assert post(client, body).status_code == 200
    (call,) = fake.calls
    assert call.raw.count(b'"messages"') == 1 and b"attacker" not in call.raw and call.body["messages"] == MESSAGES
    # The other way round, the URL image is the one read: refused.
    body = b'{"model":"%s","max_tokens":64,"messages":%s,"messages":%s}' % (
        MODEL.encode(),
        json.dumps(MESSAGES).encode(),
        hidden,
    )
    refused(post(client, body), "source_not_allowed", "messages[0].content[0]")


@pytest.mark.parametrize(
    ("blocks", "status"),
    [
        # Ten million empty blocks beside a source key: read, they would cost gigabytes.
        (b"{}," * 10_000_000, 413),
        # Blocks nested deeper than the gateway reads.
        (b'{"type":"tool_result","content":[' * 9 + b"{}" + b"]}" * 9 + b",", 400),
    ],
    ids=["ten-million-blocks", "nine-lists-deep"],
)
def test_messages_too_large_or_deep_to_read_are_refused_at_once(
    anthropic: tuple[ModelGateway, httpx.Client, FakeAnthropic], blocks: bytes, status: int
) -> None:
    gw, client, fake = anthropic
    body = b'{"model":"%s","max_tokens":64,"messages":[{"role":"user","content":[%s%s]}]}' % (
        MODEL.encode(),
        blocks,
        json.dumps(BASE64_IMAGE).encode(),
    )
    t0 = time.monotonic()
    resp = post(client, body)
    assert resp.status_code == status and "messages" in resp.json()["error"]["message"], resp.text
    assert time.monotonic() - t0 < 2
    assert fake.calls == [] and gw.requests == 0


def _image(url: str) -> dict[str, Any]:
    return {"type": "image_url", "image_url": {"url": url, "detail": "auto"}}


@pytest.mark.parametrize(
    ("part", "said"),
    [
        (_image("https://attacker.example/x.png"), "'image_url.url' is 'https://attacker.example/x.png'"),
        ({"type": "image_url", "image_url": "http://attacker.example/x.png"}, "'image_url' is 'http://"),
        ({"image_url": "https://attacker.example/x.png"}, "'image_url'"),  # vLLM reads a part with no type
        ({"type": "input_image", "image_url": "https://attacker.example/x.png"}, "'image_url'"),
        ({"type": "audio_url", "audio_url": {"url": "https://attacker.example/a.wav"}}, "'audio_url.url'"),
        ({"type": "video_url", "video_url": {"url": "file:///etc/passwd"}}, "'file:///etc/passwd'"),
        (
            {"type": "input_audio", "input_audio": {"data": "https://attacker.example/a.wav", "format": "wav"}},
            "'input_audio.data'",
        ),
        (
            {"type": "file", "file": {"filename": "a.pdf", "file_data": "https://attacker.example/a.pdf"}},
            "'file.file_data'",
        ),
        ({"type": "file", "file": {"file_id": "file-abc123"}}, "'file.file_id' names a file stored at the provider"),
        ({"type": "document_url", "document_url": "https://attacker.example/a.pdf"}, "'document_url'"),
        ({"type": "image_url", "IMAGE_URL": {"URL": "https://attacker.example/x.png"}}, "ignoring case"),
    ],
    ids=[
        "image_url",
        "image_url-string",
        "no-type",
        "input_image",
        "audio_url",
        "video_url-file",
        "input_audio-url",
        "file_data-url",
        "file_id",
        "document_url",
        "IMAGE_URL",
    ],
)
def test_an_openai_part_the_server_would_fetch_is_refused(
    openai: tuple[ModelGateway, httpx.Client, FakeOpenAI], part: dict[str, Any], said: str
) -> None:
    gw, client, fake = openai
    body = {
        "model": "llama3.1:8b",
        "messages": [*MESSAGES, {"role": "user", "content": [{"type": "text", "text": "what is this?"}, part]}],
    }
    refused(
        post(client, body, "/v1/chat/completions"),
        "source_not_allowed",
        "does not forward messages[1].content[1]:",
        said,
    )
    assert fake.calls == [] and gw.requests == 0


def test_inline_openai_parts_pass_and_an_escaped_url_beside_them_is_refused(
    openai: tuple[ModelGateway, httpx.Client, FakeOpenAI],
) -> None:
    gw, client, fake = openai
    fake.replies.append(chat("ok"))
    parts = [
        {"type": "text", "text": "https://example.com is in the text"},
        _image("data:image/png;base64,iVBORw0KGgo="),
        _image(" DATA:image/png;base64,iVBORw0KGgo="),
        {"type": "input_audio", "input_audio": {"data": "UklGRiQAAABXQVZF", "format": "wav"}},
        {"type": "file", "file": {"filename": "a.pdf", "file_data": "data:application/pdf;base64,JVBERi0x"}},
    ]
    body = json.dumps(
        {"model": "llama3.1:8b", "max_tokens": 64, "messages": [*MESSAGES, {"role": "user", "content": parts}]}
    ).encode()
    assert post(client, body, "/v1/chat/completions").status_code == 200
    assert fake.calls[0].raw == body
    unsafe = spelled(
        {
            "model": "llama3.1:8b",
            "messages": [*MESSAGES, {"role": "user", "content": [*parts, _image("https://attacker.example/x.png")]}],
        },
        (b'"url": "https', b'"\\u0075rl": "https'),
    )
    refused(post(client, unsafe, "/v1/chat/completions"), "source_not_allowed", "messages[1].content[5]")
    assert len(fake.calls) == 1


@contextlib.contextmanager
def _policed(sock: Path, policy: EgressPolicy, **limits: Any) -> Iterator[tuple[httpx.Client, FakeAnthropic]]:
    """A gateway for a group with ``policy`` (its opened server tools and domains), its client and upstream."""
    fake = FakeAnthropic()
    with (
        fake.serve() as upstream,
        ModelGateway(
            sock,
            GatewayConfig(
                base_url=upstream,
                api_key=KEY,
                model=MODEL,
                max_tokens=1024,
                server_tools=opened_tools(policy),
                search_domains=search_domains(policy),
                **limits,
            ),
        ),
        client_for(sock) as client,
    ):
        yield client, fake


def test_a_policy_that_opens_web_search_gets_it_held_to_its_domains(sock: Path) -> None:
    policy = parse_network_option("allowlist:docs.python.org,*.readthedocs.io:443,server-tool:web_search")
    with _policed(sock, policy, max_server_tool_requests=1) as (client, fake):
        fake.replies.append(message([{"type": "text", "text": "found"}], "end_turn"))
        asked = {**WEB_SEARCH, "allowed_domains": ["attacker.example"], "blocked_domains": ["python.org"]}
        resp = post(client, {**BASE, "tools": [CUSTOM, asked]})
        assert resp.status_code == 200, resp.text
        (call,) = fake.calls
        assert call.body["tools"] == [CUSTOM, {**WEB_SEARCH, "allowed_domains": ["docs.python.org", "readthedocs.io"]}]
        # Other server tools stay closed; a second search is past the run's count.
        refused(post(client, {**BASE, "tools": [WEB_FETCH]}), "tool_not_allowed", "'web_fetch_20250910'")
        refused(post(client, {**BASE, "tools": [WEB_SEARCH]}), "server_tool_budget", "requests with server tools")
        assert len(fake.calls) == 1
    # A group whose policy does not open it, or names no domain to search, gets 403 (the check).
    closed = parse_network_option("allowlist:docs.python.org")
    nowhere = EgressPolicy(mode="ask", server_tools=["web_search"])
    for policy_, said in ((closed, "'web_search_20250305'"), (nowhere, "names no domain it may search")):
        with _policed(sock, policy_) as (client, fake):
            refused(post(client, {**BASE, "tools": [WEB_SEARCH]}), "tool_not_allowed", said)
            assert fake.calls == []


def test_an_openai_compatible_search_stays_closed_whatever_the_policy(sock: Path) -> None:
    """Chat Completions' web search takes no list of domains to hold it to: a policy that
    opens ``web_search`` opens it for the Messages API only."""
    policy = parse_network_option("allowlist:docs.python.org,server-tool:web_search")
    fake = FakeOpenAI()
    with (
        fake.serve() as upstream,
        ModelGateway(
            sock,
            GatewayConfig(
                base_url=upstream,
                api_key=KEY,
                route="openai",
                model="llama3.1:8b",
                max_tokens=1024,
                server_tools=opened_tools(policy),
                search_domains=search_domains(policy),
            ),
        ),
        client_for(sock) as client,
    ):
        body = {"model": "llama3.1:8b", "messages": MESSAGES}
        search = {**body, "web_search_options": {"search_context_size": "low"}}
        refused(post(client, search, "/v1/chat/completions"), "field_not_allowed", "'web_search_options'")
        tool = {**body, "tools": [FUNCTION, {"type": "web_search"}]}
        refused(post(client, tool, "/v1/chat/completions"), "tool_not_allowed", "'web_search'")
        assert fake.calls == []
