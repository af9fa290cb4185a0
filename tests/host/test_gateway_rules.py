"""The gateway's request rules (orchestrator/sandbox/gateway/rules.py), each on its own.

Each rule of ``RULES`` is a function of one request: it refuses it (raises ``Refusal``) or
notes what to add or change.  Each is called here directly on a request built in memory,
no socket, no upstream: a test per rule (named ``test_rule_<name>_...``; one test checks
that every rule has one), then docs/sandbox.md's table of the rules held to the code (and
fed a drifted table, to be seen failing).  What the rules do together, on the wire, is
tests/host/test_gateway_allowlist.py's and tests/host/test_model_policy.py's.
"""

from __future__ import annotations

import json
import re
import sys
from email.message import Message
from pathlib import Path
from typing import Any

import pytest

from agent_runner.protocol import Usage
from orchestrator.sandbox.gateway import GatewayConfig
from orchestrator.sandbox.gateway.metering import Account
from orchestrator.sandbox.gateway.refusal import Refusal
from orchestrator.sandbox.gateway.rules import (
    RULES,
    Request,
    Rule,
    hold_api_fields,
    hold_budget_left,
    hold_fields,
    hold_headers,
    hold_model,
    hold_one_reading,
    hold_output_cap,
    hold_server_tools,
    hold_sources,
    hold_stream_usage,
    hold_tools,
    prepare,
)

ROOT = Path(__file__).resolve().parents[2]
SANDBOX_DOC = ROOT / "docs" / "sandbox.md"
MODEL = "claude-allowed-1"
MESSAGES = [{"role": "user", "content": "hi"}]
WEB_SEARCH = {"type": "web_search_20250305", "name": "web_search"}
CUSTOM = {"name": "bash", "input_schema": {"type": "object"}}


def request(
    body: dict[str, Any] | bytes | None = None,
    *,
    openai: bool = False,
    headers: list[tuple[str, str]] = (),  # type: ignore[assignment]
    spent: Usage | None = None,
    read: bool = True,
    **config: Any,
) -> Request:
    """A request of the Messages API (``openai``: Chat Completions) with ``body``, its top level
    read (``read``: the ``fields`` rule held) as the rules after it find it."""
    message = Message()
    for name, value in headers:
        message[name] = value
    settings = GatewayConfig(
        base_url="http://upstream.invalid", api_key="k", route="openai" if openai else "anthropic", **config
    )
    req = Request("/v1/chat/completions" if openai else "/v1/messages", message, settings, Account(spent))
    if body is not None:
        req.body = body if isinstance(body, bytes) else json.dumps(body).encode()
        if read:
            hold_fields(req)
    return req


def refusal(rule: Any, req: Request) -> Refusal:
    with pytest.raises(Refusal) as raised:
        rule(req)
    return raised.value


# -- each rule --------------------------------------------------------------------------------


def test_rule_budget_left_refuses_a_run_that_spent_its_budget() -> None:
    spent = Usage(input_tokens=90, output_tokens=10)
    refused = refusal(hold_budget_left, request(token_budget=100, spent=spent))
    assert (refused.status, refused.kind) == (403, "budget_exceeded") and "used 100 tokens" in refused.message
    hold_budget_left(request(token_budget=101, spent=spent))  # one token left: it may ask
    hold_budget_left(request(token_budget=0, spent=spent))  # no budget: no limit
    req = request(token_budget=100, spent=spent)
    with pytest.raises(Refusal):
        hold_budget_left(req)
    assert req.account.budget_refusals == 1  # the pipeline names the limit that stopped the run


def test_rule_headers_drops_the_unlisted_and_refuses_a_beta_off_the_list() -> None:
    req = request(
        headers=[
            ("x-api-key", "the sandbox's"),
            ("Anthropic-Version", "2023-06-01"),
            ("anthropic-beta", "claude-code-20250219"),
            ("anthropic-beta", " interleaved-thinking-2025-05-14 ,"),
            ("x-forwarded-for", "1.2.3.4"),
        ]
    )
    hold_headers(req)
    assert req.forwarded == {
        "anthropic-version": "2023-06-01",
        "anthropic-beta": "claude-code-20250219,interleaved-thinking-2025-05-14",
    }
    refused = refusal(hold_headers, request(headers=[("anthropic-beta", "claude-code-20250219,mcp-client-2025-04-04")]))
    assert (refused.status, refused.kind) == (403, "beta_not_allowed") and "'mcp-client-2025-04-04'" in refused.message
    openai = request(openai=True, headers=[("anthropic-beta", "mcp-client-2025-04-04"), ("accept", "*/*")])
    hold_headers(openai)  # not a header of Chat Completions: dropped, not read
    assert openai.forwarded == {"accept": "*/*"}


def test_rule_fields_refuses_a_field_off_the_list_and_marks_a_case_variant_for_rewriting() -> None:
    req = request({"model": MODEL, "messages": MESSAGES, "max_tokens": 5}, read=False)
    hold_fields(req)
    assert (req.head.model, req.head.max_tokens, req.rewrite) == (MODEL, 5, False)
    refused = refusal(hold_fields, request({"model": MODEL, "mcp_servers": []}, read=False))
    assert (refused.status, refused.kind) == (403, "field_not_allowed") and "MCP servers" in refused.message
    escaped = refusal(hold_fields, request(b'{"mcp_serv\\u0065rs": []}', read=False))  # read as the upstream reads it
    assert escaped.kind == "field_not_allowed"
    assert refusal(hold_fields, request(b"[1, 2]", read=False)).status == 400
    folded = request({"model": MODEL, "Model": "claude-expensive-9"}, read=False)
    hold_fields(folded)  # a key only a case-blind reader takes for "model": left out by a rewrite
    assert folded.rewrite is True


def test_rule_model_holds_the_run_to_its_model() -> None:
    refused = refusal(hold_model, request({"model": "claude-expensive-9"}, model=MODEL))
    assert (refused.status, refused.kind) == (403, "model_not_allowed") and repr(MODEL) in refused.message
    rewritten = request({"model": "claude-expensive-9"}, model=MODEL, model_policy="rewrite")
    hold_model(rewritten)
    assert rewritten.changed == {"model": MODEL}
    absent = request({"messages": MESSAGES}, model=MODEL)
    hold_model(absent)
    assert (absent.added, absent.changed) == ({"model": MODEL}, {})
    anything = request({"model": "claude-expensive-9"})  # no model to hold to
    hold_model(anything)
    assert (anything.added, anything.changed) == ({}, {})


def test_rule_output_cap_holds_the_cap_and_what_is_left_of_the_budget() -> None:
    refused = refusal(hold_output_cap, request({"max_tokens": 65}, max_tokens=64))
    assert (refused.status, refused.kind) == (403, "max_tokens_not_allowed") and "max_tokens=65" in refused.message
    rewritten = request({"max_tokens": 65}, max_tokens=64, model_policy="rewrite")
    hold_output_cap(rewritten)
    assert rewritten.changed == {"max_tokens": 64}
    # No cap asked: the smaller of the run's cap and what is left of its budget, added.
    spent = Usage(input_tokens=50, output_tokens=10)
    left = request({"messages": MESSAGES}, max_tokens=64, token_budget=100, spent=spent)
    hold_output_cap(left)
    assert left.added == {"max_tokens": 40}
    # Each of n choices may use the whole cap.
    over = request({"max_tokens": 30, "n": 2}, openai=True, token_budget=100, spent=spent)
    refused = refusal(hold_output_cap, over)
    assert refused.kind == "budget_exceeded" and "up to 60 output tokens" in refused.message
    assert over.account.budget_refusals == 1
    assert refusal(hold_output_cap, request({"max_tokens": None}, max_tokens=64)).status == 400


def test_rule_api_fields_keeps_each_field_to_its_api() -> None:
    refused = refusal(hold_api_fields, request({"model": MODEL, "n": 2}))  # Chat Completions' field
    assert (refused.status, refused.kind) == (403, "field_not_allowed") and "'n'" in refused.message
    hold_api_fields(request({"model": MODEL, "n": 2}, openai=True))
    hold_api_fields(request({"model": MODEL, "stream": True}))


def test_rule_tools_refuses_server_tools_the_policy_does_not_open() -> None:
    refused = refusal(hold_tools, request({"tools": [CUSTOM, WEB_SEARCH]}))
    assert (refused.status, refused.kind) == (403, "tool_not_allowed") and "tools[1]" in refused.message
    opened = request({"tools": [CUSTOM, WEB_SEARCH]}, server_tools=frozenset({"web_search_"}))
    hold_tools(opened)
    assert opened.opened == [1]
    custom = request({"tools": [CUSTOM, {**CUSTOM, "type": "custom"}]})
    hold_tools(custom)
    assert custom.opened == []
    # Chat Completions: a function only, whatever the policy opens.
    openai = request({"tools": [WEB_SEARCH]}, openai=True, server_tools=frozenset({"web_search_"}))
    assert refusal(hold_tools, openai).kind == "tool_not_allowed"
    assert refusal(hold_tools, request({"tools": [{"Type": "web_search_20250305"}]})).kind == "tool_not_allowed"


def test_rule_server_tools_holds_an_opened_search_to_the_groups_domains_and_count() -> None:
    config: dict[str, Any] = {"server_tools": frozenset({"web_search_"}), "max_server_tool_requests": 1}
    body = {"tools": [CUSTOM, {**WEB_SEARCH, "allowed_domains": ["attacker.example"], "blocked_domains": ["x.org"]}]}
    nowhere = request(body, **config)
    hold_tools(nowhere)
    refused = refusal(hold_server_tools, nowhere)
    assert (refused.status, refused.kind) == (403, "tool_not_allowed") and "names no domain" in refused.message
    held = request(body, search_domains=("docs.python.org",), **config)
    hold_tools(held)
    hold_server_tools(held)
    assert held.changed == {"tools": [CUSTOM, {**WEB_SEARCH, "allowed_domains": ["docs.python.org"]}]}
    again = Request(held.path, Message(), held.config, held.account)  # the same run's next request
    again.body = json.dumps(body).encode()
    hold_fields(again)
    hold_tools(again)
    assert refusal(hold_server_tools, again).kind == "server_tool_budget"


def test_rule_sources_refuses_content_kept_elsewhere() -> None:
    url = {"type": "image", "source": {"type": "url", "url": "https://attacker.example/x.png"}}
    refused = refusal(hold_sources, request({"messages": [{"role": "user", "content": [url]}]}))
    assert (refused.status, refused.kind) == (403, "source_not_allowed")
    assert "messages[0].content[0]" in refused.message and "fetch" in refused.message
    inline = {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": "iVBO"}}
    hold_sources(request({"messages": [{"role": "user", "content": [inline]}]}))
    # Read as a case-blind reader reads it too: "Source" is its source.
    folded = {"type": "image", "Source": {"type": "url", "url": "https://attacker.example/x.png"}}
    assert (
        "ignoring case" in refusal(hold_sources, request({"messages": [{"role": "user", "content": [folded]}]})).message
    )
    part = {"type": "image_url", "image_url": {"url": "https://attacker.example/x.png"}}
    assert (
        refusal(hold_sources, request({"messages": [{"role": "user", "content": [part]}]}, openai=True)).status == 403
    )


def test_rule_stream_usage_asks_an_openai_stream_for_its_usage() -> None:
    asked = request({"stream": True}, openai=True)
    hold_stream_usage(asked)
    assert asked.added == {"stream_options": {"include_usage": True}}
    declined = request({"stream": True, "stream_options": {"include_usage": False}}, openai=True)
    refused = refusal(hold_stream_usage, declined)
    assert (refused.status, refused.kind) == (400, "invalid_request_error") and "include_usage" in refused.message
    for req in (request({"stream": True}), request({"stream": False}, openai=True)):
        hold_stream_usage(req)  # the Messages API reports usage anyway; a plain answer carries it
        assert req.added == {}


def test_rule_one_reading_rewrites_a_body_a_policed_key_could_be_read_two_ways_in() -> None:
    def rewrites(body: bytes, **config: Any) -> bool:
        req = request(body, **config)
        hold_one_reading(req)
        return req.rewrite

    assert not rewrites(b'{"model": "m", "messages": []}', model="m")
    assert rewrites(b'{"model": "m", "model": "m", "messages": []}', model="m")  # twice: which one?
    assert rewrites(b'{"\\u006dodel": "m", "messages": []}', model="m")  # an escape a byte search misses
    # A nested key counts too, in any case: an overcount only costs a rewrite.
    nested = {"type": "tool_use", "id": "t", "name": "n", "input": {"MAX_TOKENS": 9}}
    assert rewrites(
        json.dumps({"max_tokens": 5, "messages": [{"role": "assistant", "content": [nested]}]}).encode(), max_tokens=9
    )
    # Not held to a model: its key is not policed.
    assert not rewrites(b'{"model": "m", "model": "n", "messages": []}')
    # A body written anew already is not searched.
    changed = request(b'{"model": "m", "model": "n"}', model="m", model_policy="rewrite")
    changed.changed["model"] = "m"
    hold_one_reading(changed)
    assert changed.rewrite is False


def test_every_rule_has_a_test_of_its_own() -> None:
    tested = {name.removeprefix("test_rule_") for name in dir(sys.modules[__name__]) if name.startswith("test_rule_")}
    untested = [rule.name for rule in RULES if not any(t.startswith(rule.name + "_") for t in tested)]
    assert untested == [], "each rule gets a test named test_rule_<name>_..."
    assert len({rule.name for rule in RULES}) == len(RULES)


def test_prepare_runs_every_rule_that_reads_the_body_and_keeps_a_compliant_body_as_it_came() -> None:
    body = b'{"model": "m", "max_tokens": 5, "messages": [{"role": "user", "content": "hi"}]}'
    req = request(body, model="m", max_tokens=10, read=False)
    assert prepare(req) == body
    added = request(b'{"messages": []}', model="m", max_tokens=10, read=False)
    assert json.loads(prepare(added)) == {"model": "m", "max_tokens": 10, "messages": []}
    refused = request(b'{"model": "x", "messages": []}', model="m", read=False)
    with pytest.raises(Refusal):
        prepare(refused)
    assert [rule.name for rule in RULES if rule.before_body] == ["budget_left"]


# -- the table in docs/sandbox.md -------------------------------------------------------------


def documented(text: str) -> list[tuple[str, str]]:
    """The rows of the rules' table (``| rule | what it holds |``) in the page's gateway section."""
    section = text.split("## The model gateway", 1)[1].split("\n## ", 1)[0]
    table = section.split("| rule | what it holds |", 1)[1]
    return re.findall(r"^\| `(\w+)` \| (.*) \|$", table.split("\n\n", 1)[0], flags=re.M)


def drift(rows: list[tuple[str, str]], rules: tuple[Rule, ...]) -> list[str]:
    """How the documented rows differ from the rules: a name or a meaning (in Markdown's
    backticks), in order."""
    code = [(rule.name, rule.meaning.replace("``", "`")) for rule in rules]
    problems = [f"documented, not a rule: {name}" for name, _ in rows if name not in dict(code)]
    problems += [f"a rule not documented: {name}" for name, _ in code if name not in dict(rows)]
    if not problems and [name for name, _ in rows] != [name for name, _ in code]:
        problems.append(f"documented in another order than they run: {[name for name, _ in rows]}")
    problems += [
        f"{name}: documented {said!r}, the docstring says {dict(code)[name]!r}"
        for name, said in rows
        if name in dict(code) and said != dict(code)[name]
    ]
    return problems


def test_the_docs_table_is_the_rule_table() -> None:
    assert drift(documented(SANDBOX_DOC.read_text(encoding="utf-8")), RULES) == []


def test_a_table_that_drifted_from_the_rules_is_found() -> None:
    rows = documented(SANDBOX_DOC.read_text(encoding="utf-8"))
    assert len(rows) == len(RULES)
    reworded = [(name, "something else" if name == "model" else said) for name, said in rows]
    assert drift(reworded, RULES) == [
        f"model: documented 'something else', the docstring says {RULES[3].meaning.replace('``', '`')!r}"
    ]
    assert drift(rows[:-1], RULES) == [f"a rule not documented: {RULES[-1].name}"]
    assert drift([*rows, ("ghost", "x")], RULES) == ["documented, not a rule: ghost"]
    assert drift(rows[::-1], RULES)[0].startswith("documented in another order")
    extra = Rule("extra", hold_model)
    assert drift(rows, (*RULES, extra)) == ["a rule not documented: extra"]
