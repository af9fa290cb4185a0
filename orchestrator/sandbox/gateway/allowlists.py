"""What a request may carry: the lists the gateway forwards by, recorded from its clients.

The gateway forwards only what is allowed, on lists recorded from what its clients send
(the pinned Claude Code CLI and our own providers; tests/gateway_wire.py records them):
an agent with a shell can post on the socket itself, and the provider's servers would
fetch, search or connect wherever a request told them to, an egress out of a sandbox
with no network.  A header not on the list is dropped; an ``anthropic-beta`` value, a
top-level field (``mcp_servers``, ``container``, OpenAI-compatible routing such as
``models``, any other not on the API's list) or a tool the provider runs on its own
servers (``web_search_*``, ``web_fetch_*``, ``code_execution_*``, ``mcp_toolset``; on
OpenAI-compatible servers, any type but ``function``) is refused (403, saying which)
before anything goes upstream (``rules.py`` holds a request to them).
"""

from __future__ import annotations

# Recorded with tests/gateway_wire.py (`python -m tests.gateway_wire`: each client in the real
# agent image against the fakes) from what the gateway's clients send: the pinned Claude Code
# CLI 2.1.332 (claude-agent-sdk==0.2.189, container/requirements-claude-code.txt) with the
# models claude-sonnet-4-5, claude-sonnet-4-6, claude-sonnet-4-20250514, claude-opus-4-1,
# claude-opus-4-5, claude-opus-4-6, claude-haiku-4-5, claude-3-7-sonnet-20250219 and a name it
# does not know (as a model newer than the pin: it then sends the most), thinking on and off;
# and our own providers (agent_runner.providers: anthropic, on the anthropic SDK 2.14.0, and
# openai_compat).  When the pin moves, record them again;
# tests/integration/test_gateway_allowlist_sandbox.py proves that the CLI passes as it is.
#
# Request headers passed on; any other is dropped (the gateway sets the key and the framing).
ANTHROPIC_HEADERS = frozenset(
    {
        "accept",
        "anthropic-beta",
        "anthropic-dangerous-direct-browser-access",
        "anthropic-version",
        "content-type",
        "user-agent",
        "x-app",
        "x-claude-code-session-id",
        "x-stainless-arch",
        "x-stainless-async",
        "x-stainless-lang",
        "x-stainless-os",
        "x-stainless-package-version",
        "x-stainless-raw-response",
        "x-stainless-read-timeout",
        "x-stainless-retry-count",
        "x-stainless-runtime",
        "x-stainless-runtime-version",
        "x-stainless-timeout",
    }
)
OPENAI_HEADERS = frozenset({"accept", "content-type", "user-agent"})
# anthropic-beta values: a beta turns on what reaches the network (mcp-client-*, web-fetch-*,
# code-execution-*, files-api-*), so one not on the list is refused, not dropped.
ANTHROPIC_BETAS = frozenset(
    {
        "claude-code-20250219",
        "context-management-2025-06-27",
        "effort-2025-11-24",
        "interleaved-thinking-2025-05-14",
        "mid-conversation-tool-changes-2026-07-01",
        "thinking-display-updates-2026-08-18",
        "thinking-token-count-2026-05-13",
    }
)
# Top-level fields: the recorded ones and the documented ones that reach neither the network nor
# another model.  Left out: what reaches them (mcp_servers, container, fallbacks; models, route,
# plugins, web_search_options on OpenAI-compatible servers), what changes what a token costs
# (service_tier, speed, inference_geo, audio) and what keeps data at the provider (store).
ANTHROPIC_FIELDS = frozenset(
    {
        "model",
        "messages",
        "max_tokens",
        "system",
        "stream",
        "metadata",
        "thinking",
        "tools",
        "tool_choice",
        "temperature",
        "top_k",
        "top_p",
        "stop_sequences",
        "context_management",
        "output_config",
        "output_format",
        "cache_control",
    }
)
OPENAI_FIELDS = frozenset(
    {
        "model",
        "messages",
        "max_tokens",
        "max_completion_tokens",
        "n",
        "stream",
        "stream_options",
        "tools",
        "tool_choice",
        "parallel_tool_calls",
        "temperature",
        "top_p",
        "stop",
        "presence_penalty",
        "frequency_penalty",
        "seed",
        "response_format",
        "logit_bias",
        "logprobs",
        "top_logprobs",
        "user",
        "reasoning_effort",
    }
)
# Why the 403 of some fields says no (any other: it is not on the list).
REFUSED_FIELDS = {
    "mcp_servers": "the provider's servers would connect to MCP servers at any URL",
    "container": "it names a code-execution container on the provider's servers",
    "fallbacks": "it names other models to answer",
    "models": "it names other models to answer",
    "route": "it lets the server answer with another model",
    "plugins": "plugins (web search, ...) reach the network from the server",
    "web_search_options": "the server would search the web",
}
# A tool the agent runs itself: a custom tool (no type, or "custom") in the Messages API, a
# function in Chat Completions.  Any other type is one the provider runs on its own servers
# (web_search_*, web_fetch_*, code_execution_*, mcp_toolset, ...): refused.
ANTHROPIC_TOOL_TYPES: frozenset[str | None] = frozenset({None, "custom"})
OPENAI_TOOL_TYPES: frozenset[str | None] = frozenset({"function"})
