"""The model gateway: the sandbox's only way out, and it holds the secret.

For each run that uses a real model, the worker serves an HTTP endpoint on a
unix socket inside the run's private folder, which is mounted into the
container.  The container talks to the model API through it; the gateway
adds the API key, forwards only the model API's route, and counts tokens.
The container never sees the key: not in its environment, files or
arguments.

The gateway forwards only what is allowed, on lists recorded from what its
clients send (the pinned Claude Code CLI and our own providers; see the
constants below and tests/gateway_wire.py): an agent with a shell can post
on the socket itself, and the provider's servers would fetch, search or
connect wherever a request told them to, an egress out of a sandbox with no
network.  A header not on the list is dropped; an ``anthropic-beta`` value,
a top-level field (``mcp_servers``, ``container``, OpenAI-compatible
routing such as ``models``, any other not on the API's list) or a tool the
provider runs on its own servers (``web_search_*``, ``web_fetch_*``,
``code_execution_*``, ``mcp_toolset``; on OpenAI-compatible servers, any
type but ``function``) is refused (403, saying which) before anything goes
upstream; the query string is left off.  So is a block of the messages that
names content kept elsewhere (:func:`_hold_sources`; 403
``source_not_allowed``, naming the message and block and why): a source of
type ``url`` (or ``file``, a file stored at the provider) on an image, a
document or any block, in a ``tool_result``'s content or a document's too;
on OpenAI-compatible servers an image, audio, video or file part (``image_url``
and the like, whatever its type) whose URL is not a ``data:`` URL, or a
``file_id``.  Inline content passes: base64, text and content sources,
``data:`` URLs, base64 data.  The messages are read only when a byte search
finds a source key in them, as their readers read them: as they are and, if a
key is spelled in another case, as a reader that matches keys ignoring case
(Go's encoding/json) reads them.

Two upstreams (:data:`UPSTREAMS`, the route of a provider's row in
``sandbox/providers.py``; :meth:`ModelGateway.for_provider`): Anthropic (``POST
/v1/messages``, key in ``x-api-key``) and an OpenAI-compatible server (``POST
/v1/chat/completions``, key as ``Authorization: Bearer``, none when no key
is configured, as for a local Ollama).  Token counts are read from either
usage shape, streamed (SSE) or not, cache tokens included.

Everything the sandbox sends is hostile, so every resource it can make the
host spend is bounded: connections (one thread each, at most
``max_connections``; more are closed at once), time (``read_timeout_s`` on
every read, idle keep-alive included), request size (a valid
``Content-Length`` up to ``max_request_bytes``, no chunked bodies), and
money: one request upstream at a time, so the budget check before a request
sees what every earlier one cost, and a request's output cap
(``max_tokens``) must fit what is left of the run's budget.

The gateway also decides what a run may ask for (``model``, ``max_tokens``:
the host's settings, passed in by the pipeline): a request that names
another model, or asks for a larger output cap, is refused (403, saying
what is allowed) or, under the ``rewrite`` policy, sent with the host's
values instead.  The body is read as the upstream reads it: msgspec takes
the last of duplicate keys and unescapes them, as Python's json, Go's
encoding/json and pydantic do, so a field not on the list is refused however
it is spelled; a body where a policed key (those two, ``tools`` and
``messages``) could be read another way (it appears more than once, in any
case, or spelled with escapes) has its top level written anew
(:func:`_rewritten`), so the upstream gets one copy of each key, the one that
was checked.
"""

from __future__ import annotations

import collections
import contextlib
import functools
import itertools
import json
import logging
import operator
import os
import re
import selectors
import socket
import socketserver
import ssl
import stat
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal, TypedDict, TypeVar

import httpx
import msgspec

from agent_runner.protocol import Usage
from orchestrator.core.errors import GatewayError
from orchestrator.sandbox.providers import GatewayRoute, facts_of, split_spec

if TYPE_CHECKING:
    from orchestrator.core.settings import Settings

log = logging.getLogger(__name__)

# sockaddr_un.sun_path holds 108 bytes on Linux; a NUL-terminated path must fit.
_MAX_UNIX_PATH = 107

MAX_REQUEST_BYTES = 32 * 1024 * 1024
MAX_CONNECTIONS = 16
READ_TIMEOUT_S = 30.0
# An event-stream line longer than this is passed on but not read for usage
# (usage lines are small; this bounds what one stream may buffer).
_MAX_SSE_LINE = 1 << 20

ANTHROPIC_PATHS = frozenset({"/v1/messages"})
OPENAI_PATHS = frozenset({"/v1/chat/completions"})
Auth = Literal["x-api-key", "bearer"]
ModelPolicy = Literal["refuse", "rewrite"]


@dataclass(frozen=True, slots=True)
class Upstream:
    """An API the gateway forwards to: the paths it serves, how its key is sent, and the
    settings that name its server and its key."""

    paths: frozenset[str]
    auth: Auth
    base_url: Callable[[Settings], str]
    api_key: Callable[[Settings], str]
    # The setting it cannot be used without, by name (for a refusal's text) and as read: a
    # group's choice of model is refused while it is empty (run/profile.py).  Anthropic's
    # API needs a key; an OpenAI-compatible server often needs none, but an address.
    required: tuple[str, Callable[[Settings], str]]


# A provider's gateway route (sandbox/providers.py) -> the API it forwards to.
UPSTREAMS: Mapping[GatewayRoute, Upstream] = {
    "anthropic": Upstream(
        ANTHROPIC_PATHS,
        "x-api-key",
        lambda s: s.anthropic_base_url,
        lambda s: s.anthropic_api_key,
        ("ORCHESTRATOR_ANTHROPIC_API_KEY", lambda s: s.anthropic_api_key),
    ),
    "openai": Upstream(
        OPENAI_PATHS,
        "bearer",
        lambda s: s.openai_base_url,
        lambda s: s.openai_api_key,
        ("ORCHESTRATOR_OPENAI_BASE_URL", lambda s: s.openai_base_url),
    ),
}


def missing_setting(settings: Settings, route: GatewayRoute) -> str | None:
    """The setting ``route``'s upstream needs that ``settings`` leave empty (None: it is configured)."""
    name, read = UPSTREAMS[route].required
    return None if read(settings).strip() else name


# -- what a request may carry ------------------------------------------------------------------
#
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
_REFUSED_FIELDS = {
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

# The request fields the gateway holds to the host's settings.
_POLICED = ("model", "max_tokens", "max_completion_tokens")
# How a policed key could be spelled so that a byte search misses it: a JSON
# escape of an ASCII letter or "_" (\u006d, \u005F; no encoder writes these
# on its own), or the two characters Go's encoding/json (Ollama's) folds to
# "k" and "s" when it matches keys, which it does ignoring case: the Kelvin
# sign and the long s, escaped or not.
_ESCAPED_NAME_CHAR = re.compile(rb"\\u(?:00[4-7][0-9a-fA-F]|212[aA]|017[fF])")  # a literal prefix: a fast search
_GO_FOLDED = (b"\xe2\x84\xaa", b"\xc5\xbf")  # the two, in UTF-8
# A key of a message's block (or part) that can name content kept elsewhere, for a server to
# fetch: the Messages API's "source" (of an image, a document, ...), and the URLs, files and
# audio of Chat Completions parts (OpenAI's, vLLM's, llama.cpp's, Mistral's, OpenRouter's).
_SOURCE_KEYS = (
    "source",
    "url",
    "image_url",
    "audio_url",
    "video_url",
    "file_url",
    "document_url",
    "input_audio",
    "file",
    "file_id",
    "file_data",
)


# The policed keys (in every body) and the source keys (in the messages), quoted, counted in one
# pass over the body lowered (four byte counts took four times as long as one pass): in any case,
# as Go's encoding/json matches keys ignoring it.  The closing quote is only looked at, as a count
# of each would see a quote shared by two; the lookahead for a first and a second letter passes
# most quotes (there is one every few bytes of a text of code) over at once.
def _key_search(*names: str) -> re.Pattern[bytes]:
    first, second = ("".join(sorted({name[i] for name in names})) for i in (0, 1))
    return re.compile(rb'"(?=[%s][%s])(%s)(?=")' % (first.encode(), second.encode(), "|".join(names).encode()))


_POLICED_KEY = _key_search("model", "max_tokens", "max_completion_tokens", "tools", "messages")
_QUOTED_KEY = _key_search("model", "max_tokens", "max_completion_tokens", "tools", "messages", *_SOURCE_KEYS)
# A body with more counted keys than this is not counted further (a hostile one could have
# millions: ~1 s each): it is rewritten, if a policed key is counted, and refused, if its
# messages' keys are.  A real request has a handful.
_MAX_COUNTED = 200_000
_MATCHED = operator.itemgetter(1)  # what a search found, one by one (a list of them all could be large)
_SOURCE_KEY_BYTES = frozenset(name.encode() for name in _SOURCE_KEYS)
# A content list is read one level at a time, each level a decode of its own (lists in lists
# are rare: a tool_result's content, a document's content source), this deep at most; a
# request that nests blocks deeper is refused.
_MAX_SOURCE_DEPTH = 8
# Reading the blocks builds an object for each message and block, and one for each source key:
# a hostile list of millions of tiny blocks ([{},{},...]) would cost hundreds of MB.  Every
# block is an object, so this many objects (a '{' before a key or a '}': a fast count of every
# '{' first) and this many source keys bound it (~25 MB at worst); a 2.7 MB Claude Code session
# has a few thousand objects.
_MAX_PARTS = 100_000
# An object starts so; a '{' before anything else is in a string.
_OBJECT_START = re.compile(rb'\{(?=[ \t\r\n]*["}])')
# Sources the Messages API takes inline; any other ("url", "file": a file at the provider) is refused.
_INLINE_SOURCE_TYPES = frozenset({"base64", "text", "content"})
# Leading characters a URL parser strips (WHATWG, Python's urllib) before it reads the scheme.
_URL_LEADING = bytes(range(0x21)).decode()
# Writing a body's top level anew decodes it into a dict of raw values: its
# cost grows with the top-level keys, which a hostile body could have by the
# million.  Every key is followed by a ':', so this many colons bounds it
# (about 0.3 s and 20 MB at worst); a real request has a handful of top-level
# keys and far fewer colons.
_MAX_REWRITE_COLONS = 200_000
# Reading the tools' types builds an object for each tool and key: a hostile list of millions of
# tiny tools ([{},{},...]) would cost hundreds of MB.  Every tool is an object and every key is
# followed by a ':', so this many of both bound it (a few MB and ~20 ms at worst); Claude Code's
# 17 tools have under 800.
# Requests with a server tool (the provider's web search) one run may make: their fees are not tokens.
MAX_SERVER_TOOL_REQUESTS = 20
_MAX_TOOL_ITEMS = 50_000

_INPUT_KEYS = ("input_tokens", "cache_creation_input_tokens", "cache_read_input_tokens")  # Anthropic
_OUTPUT_KEYS = ("output_tokens", "completion_tokens")


@functools.cache
def _tls_context() -> ssl.SSLContext:
    """The upstream client's TLS context, made once per process.

    Loading the CA bundle is most of what a new ``httpx.Client`` costs (tens
    of ms, over 100 on a busy machine): every run opens a gateway, and
    would pay it again (docs/performance.md, "The model gateway").  httpx
    makes the same one (``SSL_CERT_FILE``/``SSL_CERT_DIR`` honoured).
    """
    return httpx.create_ssl_context()


class _Head(msgspec.Struct):
    """The top-level fields of a request the gateway acts on; msgspec skips the rest without building it.

    UNSET (absent) and None (null) differ: only an absent field may be added.
    """

    model: str | None | msgspec.UnsetType = msgspec.UNSET
    stream: bool | None = None
    max_tokens: int | None | msgspec.UnsetType = msgspec.UNSET
    max_completion_tokens: int | None | msgspec.UnsetType = msgspec.UNSET  # OpenAI's newer name
    n: int | None | msgspec.UnsetType = msgspec.UNSET  # OpenAI: choices, each up to the output cap
    stream_options: msgspec.Raw = msgspec.Raw()  # empty: absent
    tools: msgspec.Raw = msgspec.Raw()  # read by _hold_tools
    messages: msgspec.Raw = msgspec.Raw()  # read by _hold_sources


_HEAD_FIELDS = frozenset(_Head.__struct_fields__)


class _StreamOptions(msgspec.Struct):
    include_usage: bool | None = None


class _Part(msgspec.Struct, gc=False):
    """A block (a part) of a message's content, as far as a source can hide in it.

    Only these keys are read, each a raw value that :func:`_hold_part` decodes when present
    (msgspec skips the others without building them: a text, a tool's input): ``content``
    (a list of blocks), the Messages API's ``source``, and what Chat Completions servers
    fetch or look up (vLLM, llama.cpp, Mistral, OpenRouter, OpenAI's files), whatever the
    part's type says (vLLM reads a part with no type by its keys).
    """

    content: msgspec.Raw = msgspec.Raw()
    source: msgspec.Raw = msgspec.Raw()
    url: msgspec.Raw = msgspec.Raw()
    image_url: msgspec.Raw = msgspec.Raw()
    audio_url: msgspec.Raw = msgspec.Raw()
    video_url: msgspec.Raw = msgspec.Raw()
    file_url: msgspec.Raw = msgspec.Raw()
    document_url: msgspec.Raw = msgspec.Raw()
    input_audio: msgspec.Raw = msgspec.Raw()
    file: msgspec.Raw = msgspec.Raw()
    file_id: msgspec.Raw = msgspec.Raw()
    file_data: msgspec.Raw = msgspec.Raw()


class _Message(msgspec.Struct, gc=False):
    """A message: its content, a list of blocks read with it (most are), or a string."""

    content: list[_Part] | str | None = None


class _Messages(msgspec.Struct, gc=False):
    """A body's messages (the others fields passed over)."""

    messages: list[_Message] | None = None


class _Source(_Part):
    """A block's ``source`` object: its type, and any key a block could name content with."""

    type: msgspec.Raw = msgspec.Raw()


class _Media(msgspec.Struct, gc=False):
    """The object a part's URL, audio or file key holds (``{"url": ...}``, ``{"data": ..., "format": ...}``)."""

    url: msgspec.Raw = msgspec.Raw()
    file_url: msgspec.Raw = msgspec.Raw()
    data: msgspec.Raw = msgspec.Raw()
    file_data: msgspec.Raw = msgspec.Raw()
    file_id: msgspec.Raw = msgspec.Raw()


# What each key of a part holds: a URL (only a data: URL is inline), or data (base64, or a data: URL).
_URL_KEYS = ("url", "image_url", "audio_url", "video_url", "file_url", "document_url")
_DATA_KEYS = ("input_audio", "file", "file_data")


@dataclass(frozen=True)
class _Wire:
    """What a request of one API may carry."""

    api: str
    headers: frozenset[str]
    betas: frozenset[str]
    fields: frozenset[str]
    tool_types: frozenset[str | None]
    # The body's top level as a _Head whose other fields are on the list (msgspec.Raw: passed
    # over, never built); a field not on the list fails the decode, however it is spelled
    # (msgspec unescapes keys, and matches them exactly).
    decoder: msgspec.json.Decoder[Any]


def _wire(
    api: str, headers: frozenset[str], betas: frozenset[str], fields: frozenset[str], tool_types: frozenset[str | None]
) -> _Wire:
    listed = [(name, msgspec.Raw, msgspec.Raw()) for name in sorted(fields - _HEAD_FIELDS)]
    head = msgspec.defstruct(f"_{api.replace(' ', '')}Head", listed, bases=(_Head,), forbid_unknown_fields=True)
    return _Wire(api, headers, betas, fields, tool_types, msgspec.json.Decoder(head))


_ANTHROPIC = _wire("Messages API", ANTHROPIC_HEADERS, ANTHROPIC_BETAS, ANTHROPIC_FIELDS, ANTHROPIC_TOOL_TYPES)
_OPENAI = _wire("Chat Completions", OPENAI_HEADERS, frozenset(), OPENAI_FIELDS, OPENAI_TOOL_TYPES)
_LENIENT = msgspec.json.Decoder(_Head)
_TOP_LEVEL = msgspec.json.Decoder(dict[str, msgspec.Raw])
_TOOLS = msgspec.json.Decoder(list[dict[str, msgspec.Raw]] | None)
_TOOL_TYPE = msgspec.json.Decoder(str)
_MESSAGES = msgspec.json.Decoder(list[_Message])
_LOWERED_BODY = msgspec.json.Decoder(_Messages)
_PARTS = msgspec.json.Decoder(list[_Part])
_SOURCE = msgspec.json.Decoder(_Source | str | None)
_MEDIA = msgspec.json.Decoder(_Media | str | None)


def _wire_of(path: str) -> _Wire:
    return _OPENAI if path in OPENAI_PATHS else _ANTHROPIC


class _Refusal(Exception):
    """An answer the gateway gives itself, without going upstream."""

    def __init__(self, status: int, kind: str, message: str) -> None:
        super().__init__(message)
        self.status, self.kind, self.message = status, kind, message


class _Scan:
    """What byte searches tell of a request's body (and its messages): each made once, when first asked."""

    def __init__(self, body: bytes, head: _Head) -> None:
        self.body = body
        self.head = head
        # The messages are most of the body (a long session): searched with it, and read
        # folded from it lowered (kept for :func:`_hold_sources`, which lets it go).
        self.whole = len(head.messages) * 2 >= len(body)
        self.lowered: bytes | None = None

    @functools.cached_property
    def keys(self) -> collections.Counter[bytes]:
        """The policed keys (and the source keys, if :attr:`whole`), quoted, in any case (Go's
        encoding/json matches keys ignoring it): nested keys and string values alike (an
        overcount is safe)."""
        lowered = self.body.lower()
        if self.whole:
            self.lowered = lowered
        return _keys(_QUOTED_KEY if self.whole else _POLICED_KEY, lowered)

    def count(self, name: bytes) -> int:
        """``name``, quoted, in any case (-1: the keys were too many to count)."""
        return -1 if _capped(self.keys) else self.keys[name]

    @functools.cached_property
    def respelled(self) -> bool:
        """Could the body spell a key character another way (:data:`_ESCAPED_NAME_CHAR`)?"""
        return _respelled(self.body)

    @functools.cached_property
    def message_keys(self) -> collections.Counter[bytes]:
        """The source keys in the messages, quoted, in any case: the body's less its other
        fields' if :attr:`whole`, else the messages' own.  A key outside the fields the head
        holds (the top level's own, those only a case-blind reader takes for a policed one)
        counts as the messages': an overcount, which costs a decode."""
        if not self.whole:
            return _keys(_QUOTED_KEY, bytes(self.head.messages).lower())
        if _capped(self.keys):
            return self.keys
        keys = self.keys.copy()
        head = self.head
        for name in head.__struct_fields__:
            if name != "messages" and isinstance(value := getattr(head, name), msgspec.Raw) and value:
                keys.subtract(_keys(_QUOTED_KEY, bytes(value).lower()))
        return keys

    @functools.cached_property
    def messages_respelled(self) -> bool:
        return self.respelled if self.whole else _respelled(bytes(self.head.messages))


def _keys(search: re.Pattern[bytes], lowered: bytes | bytearray) -> collections.Counter[bytes]:
    """What ``search`` finds in ``lowered``, by name, up to about :data:`_MAX_COUNTED`."""
    if len(lowered) <= 6 * _MAX_COUNTED:  # a key and its ':' or ',' take 6 bytes at least: a short list
        return collections.Counter(search.findall(lowered))
    found = map(_MATCHED, search.finditer(lowered))
    return collections.Counter(itertools.islice(found, _MAX_COUNTED + 1))


def _capped(keys: collections.Counter[bytes]) -> bool:
    return keys.total() > _MAX_COUNTED


def _respelled(data: bytes) -> bool:
    return (
        _ESCAPED_NAME_CHAR.search(data) is not None
        # The last byte alone first: a search for one byte is many times faster.
        or any(char[-1:] in data and char in data for char in _GO_FOLDED)
    )


def _estimate(n_bytes: int) -> int:
    # Roughly 4 bytes a token: only used when an answer carried no usage, and
    # on the high side for JSON and SSE framing, which is what a budget wants.
    return (n_bytes + 3) // 4


class _Meter:
    """The usage of one answer: the latest count of each field seen (streamed counts are cumulative)."""

    def __init__(self) -> None:
        self.fields: dict[str, int] = {}
        self.final = False  # an output count that is the answer's last word was seen
        self.response_bytes = 0

    def see(self, usage: object, *, final: bool) -> None:
        if not isinstance(usage, dict):
            return
        for key in (*_INPUT_KEYS, *_OUTPUT_KEYS, "prompt_tokens"):
            value = usage.get(key)
            if isinstance(value, int) and not isinstance(value, bool) and value >= 0:
                self.fields[key] = value
        if final and any(k in self.fields for k in _OUTPUT_KEYS):
            self.final = True

    def cache_tokens(self) -> tuple[int, int]:
        """The prompt tokens read from and written to Anthropic's cache (part of the input count)."""
        return self.fields.get("cache_read_input_tokens", 0), self.fields.get("cache_creation_input_tokens", 0)

    def tokens(self, request_bytes: int) -> tuple[int, int]:
        f = self.fields
        if "prompt_tokens" in f:  # OpenAI: cached prompt tokens are part of prompt_tokens
            tokens_in = f["prompt_tokens"]
        elif any(k in f for k in _INPUT_KEYS):  # Anthropic: cache reads and writes are not
            tokens_in = sum(f.get(k, 0) for k in _INPUT_KEYS)
        else:
            tokens_in = _estimate(request_bytes)
        tokens_out = f.get("completion_tokens", f.get("output_tokens", 0))
        if not self.final:
            # No final count (a server that does not report it, a stream cut
            # short): charge what arrived rather than nothing.
            tokens_out = max(tokens_out, _estimate(self.response_bytes))
        return tokens_in, tokens_out


class _SseUsage:
    """Reads usage from an event stream as it passes through, a line at a time, in bounded memory."""

    def __init__(self, meter: _Meter) -> None:
        self.meter = meter
        self._line = bytearray()
        self._skipping = False

    def feed(self, chunk: bytes) -> None:
        self.meter.response_bytes += len(chunk)
        start = 0
        while (end := chunk.find(b"\n", start)) >= 0:
            if not self._skipping:
                self._line += chunk[start:end]
                self._read(bytes(self._line))
            self._line.clear()
            self._skipping = False
            start = end + 1
        if not self._skipping:
            self._line += chunk[start:]
            if len(self._line) > _MAX_SSE_LINE:
                self._line.clear()
                self._skipping = True

    def _read(self, line: bytes) -> None:
        # A quoted "usage" cannot occur inside a JSON string (its quotes would
        # be escaped): only events that carry usage are parsed.
        if not line.startswith(b"data:") or b'"usage"' not in line:
            return
        try:
            event = json.loads(line[5:])
        except ValueError:
            return
        if not isinstance(event, dict):
            return
        if event.get("type") == "message_start" and isinstance(event.get("message"), dict):
            # Anthropic: input and cache counts, and a first output count.
            self.meter.see(event["message"].get("usage"), final=False)
        # Anthropic's message_delta (the final output count) or OpenAI's last
        # chunk (stream_options.include_usage).
        self.meter.see(event.get("usage"), final=True)


def chmod_socket(dir_fd: int, name: bytes, mode: int) -> None:
    """chmod the socket ``name`` in ``dir_fd``; never through a symlink, never anything but a socket."""
    if not hasattr(os, "O_PATH"):  # not Linux: lchmod semantics where the platform has them
        st = os.stat(name, dir_fd=dir_fd, follow_symlinks=False)
        if not stat.S_ISSOCK(st.st_mode):
            raise GatewayError(f"{name!r} is not the gateway's socket")
        os.chmod(name, mode, dir_fd=dir_fd, follow_symlinks=False)
        return
    # O_PATH|O_NOFOLLOW opens a symlink itself instead of its target; the
    # fstat then refuses it, and the chmod goes to the inode we checked.
    fd = os.open(name, os.O_PATH | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=dir_fd)
    try:
        if not stat.S_ISSOCK(os.fstat(fd).st_mode):
            raise GatewayError(f"{name!r} was replaced before its mode was set; refusing to chmod it")
        os.chmod(f"/proc/self/fd/{fd}", mode)
    finally:
        os.close(fd)


class _UnixHTTPServer(socketserver.ThreadingMixIn, socketserver.UnixStreamServer):
    daemon_threads = True
    # close() ends the connections itself and waits a bounded time.
    block_on_close = False
    # A burst of connects is accepted (and, over the cap, closed) at once
    # instead of making the sandbox's connects wait on the backlog.
    request_queue_size = 128

    def __init__(self, path: Path, handler: type[BaseHTTPRequestHandler], max_connections: int) -> None:
        self._slots = threading.BoundedSemaphore(max_connections)
        self._open: dict[socket.socket, threading.Thread] = {}
        self._open_lock = threading.Lock()
        self.dropped = 0
        self._dir_fd = -1
        self._path = os.fsencode(path)
        self._stopping = False
        self._wake_r, self._wake_w = os.pipe()  # close-on-exec
        try:
            super().__init__(str(path), handler)
        except BaseException:
            os.close(self._wake_r)
            os.close(self._wake_w)
            raise

    def serve(self) -> None:
        """Accept connections until :meth:`stop`, which wakes the wait at once.

        ``serve_forever`` would poll for its shutdown instead, and every
        run's close would wait for the next poll (50 ms on average with
        its 0.1 s).
        """
        with selectors.DefaultSelector() as selector:
            selector.register(self, selectors.EVENT_READ)
            selector.register(self._wake_r, selectors.EVENT_READ)
            while not self._stopping:
                for key, _ in selector.select():
                    if key.fileobj is self and not self._stopping:
                        # socketserver's own accept-and-dispatch step; typeshed leaves private methods out.
                        self._handle_request_noblock()  # type: ignore[attr-defined]

    def stop(self) -> None:
        """End :meth:`serve` (from another thread); accept nothing more."""
        self._stopping = True
        os.write(self._wake_w, b"\0")

    def server_bind(self) -> None:
        # Every step goes through a descriptor of the folder, and none follows
        # a symlink: defence in depth, should the sandbox ever be able to
        # write the folder (it is a host-only folder, mounted read-only).
        path = self._path
        folder, name = os.path.dirname(path) or b".", os.path.basename(path)
        self._dir_fd = os.open(folder, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
        try:
            os.unlink(name, dir_fd=self._dir_fd)  # a leftover entry, a symlink itself, never its target
        except FileNotFoundError:
            pass
        # The folder's path can be longer than a unix socket address allows:
        # bind through its /proc/self/fd entry instead (same folder, short name).
        bind_to = path
        if os.path.isdir("/proc/self/fd"):
            bind_to = f"/proc/self/fd/{self._dir_fd}/".encode() + name
        if len(bind_to) > _MAX_UNIX_PATH:
            raise GatewayError(f"the gateway socket's path is too long: {self.server_address}")
        try:
            self.socket.bind(bind_to)
        except OSError as exc:
            raise GatewayError(f"cannot bind the gateway socket {self.server_address}: {exc}") from exc
        # The sandbox runs as another uid; it may connect, nobody else is in
        # the run's private folder.
        chmod_socket(self._dir_fd, name, 0o666)

    def server_close(self) -> None:
        super().server_close()
        for fd in (self._wake_r, self._wake_w):
            if fd >= 0:
                os.close(fd)
        self._wake_r = self._wake_w = -1
        if self._dir_fd >= 0:
            try:
                os.unlink(os.path.basename(self._path), dir_fd=self._dir_fd)
            except OSError:
                pass  # gone already, or replaced by something that is not ours to remove
            os.close(self._dir_fd)
            self._dir_fd = -1

    def process_request(self, request: Any, client_address: Any) -> None:
        # Over the cap: closed now, in the accepting thread, without a thread
        # of its own (the container's pids limit does not bound host threads).
        if not self._slots.acquire(blocking=False):
            self.dropped += 1
            if self.dropped == 1:
                log.warning("model gateway: more than its connection limit open at once; closing the extra ones")
            self.shutdown_request(request)
            return
        try:
            super().process_request(request, client_address)
        except BaseException:
            self._slots.release()
            self.shutdown_request(request)
            raise

    def process_request_thread(self, request: Any, client_address: Any) -> None:
        with self._open_lock:
            self._open[request] = threading.current_thread()
        try:
            super().process_request_thread(request, client_address)
        finally:
            with self._open_lock:
                self._open.pop(request, None)
            self._slots.release()

    def handle_error(self, request: Any, client_address: Any) -> None:
        # A sandbox that hangs up or misbehaves is not the host's error.
        log.debug("model gateway: a connection ended with an error", exc_info=True)

    def end_connections(self, wait_s: float) -> None:
        """Shut every open connection down (their reads end at once) and wait up to ``wait_s`` for their threads."""
        with self._open_lock:
            open_now = list(self._open.items())
        for conn, _ in open_now:
            try:
                conn.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
        deadline = time.monotonic() + wait_s
        for _, thread in open_now:
            thread.join(max(0.0, deadline - time.monotonic()))


class _Limits(TypedDict):
    """The bounds :meth:`ModelGateway.for_provider` takes from the settings (keyword arguments)."""

    model: str | None
    max_tokens: int | None
    model_policy: ModelPolicy
    token_budget: int
    spent: Usage | None
    max_request_bytes: int
    max_connections: int
    read_timeout_s: float


class ModelGateway:
    """Forward ``allowed_paths`` from a unix socket to ``upstream`` with the key added.

    ``auth`` says how: ``x-api-key`` (Anthropic; always sent) or ``bearer``
    (``Authorization: Bearer <key>``, left out when the key is empty).

    ``input_tokens``/``output_tokens`` are the run's totals: they start at
    ``spent`` (what earlier attempts of the run used), so ``token_budget``
    holds per run, not per attempt.

    ``model`` and ``max_tokens`` are what the run may ask for (None: anything);
    ``model_policy`` says what happens to a request that asks for more:
    ``refuse`` (403) or ``rewrite`` (sent with the allowed values).
    """

    def __init__(
        self,
        socket_path: Path,
        *,
        upstream: str,
        api_key: str,
        allowed_paths: frozenset[str] = ANTHROPIC_PATHS,
        auth: Auth = "x-api-key",
        timeout_s: float = 600.0,
        token_budget: int = 0,
        spent: Usage | None = None,
        max_request_bytes: int = MAX_REQUEST_BYTES,
        max_connections: int = MAX_CONNECTIONS,
        read_timeout_s: float = READ_TIMEOUT_S,
        model: str | None = None,
        max_tokens: int | None = None,
        model_policy: ModelPolicy = "refuse",
        server_tools: frozenset[str] = frozenset(),
        search_domains: tuple[str, ...] = (),
        max_server_tool_requests: int = MAX_SERVER_TOOL_REQUESTS,
    ) -> None:
        self.socket_path = socket_path
        # Server tools the group's network policy opens (egress_policy.SERVER_TOOLS: type
        # prefixes such as "web_search_"), the domains they are held to, and how many requests
        # with them one run may make (their fees are not tokens).
        self.server_tools = server_tools
        self.search_domains = search_domains
        self.max_server_tool_requests = max_server_tool_requests
        self.server_tool_requests = 0
        self.upstream = upstream.rstrip("/")
        self.allowed_paths = allowed_paths
        spent = spent or Usage()
        self.input_tokens = spent.input_tokens
        self.output_tokens = spent.output_tokens
        self.cache_read_input_tokens = spent.cache_read_input_tokens
        self.cache_creation_input_tokens = spent.cache_creation_input_tokens
        self.requests = 0
        self.refused = 0
        # Requests refused because the run's token budget was spent or would be:
        # the pipeline tells the chat which limit stopped the run.
        self.budget_refusals = 0
        self.model = model
        self.max_tokens = max_tokens
        self.model_policy = model_policy
        self.max_request_bytes = max_request_bytes
        self.read_timeout_s = read_timeout_s
        self._timeout_s = timeout_s
        self._lock = threading.Lock()  # the counters
        # One request at a time, from reading its body to its answer's last
        # byte: the budget check sees every earlier request's cost, and at
        # most one body is in memory.
        self._one_at_a_time = threading.Lock()
        self._client = httpx.Client(timeout=timeout_s, verify=_tls_context())
        self._api_key = api_key
        self._auth = auth
        # Input + output tokens one run may spend (0: no limit).  Checked
        # before each request, which must also fit its output cap in what is
        # left: a run can overspend only by the input of its last request.
        self.token_budget = token_budget
        gateway = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"
            # Set on the connection before the first read: the request line,
            # headers, body and the wait for a keep-alive's next request.
            timeout = read_timeout_s

            def address_string(self) -> str:  # unix sockets have no peer address
                return "sandbox"

            def log_message(self, fmt: str, *args: object) -> None:
                log.debug("gateway: " + fmt, *args)

            def send_error(self, code: int, message: str | None = None, explain: str | None = None) -> None:
                # http.server's own refusals (bad request line, too many or too
                # long headers, unknown method) as JSON errors too.
                gateway._answer_error(self, code, "invalid_request_error", message or explain or "bad request")

            def do_POST(self) -> None:  # noqa: N802 - http.server's naming
                gateway._handle(self)

            def do_GET(self) -> None:  # noqa: N802
                gateway._refuse(self)

            do_PUT = do_DELETE = do_PATCH = do_HEAD = do_OPTIONS = do_GET  # noqa: N815

        socket_path.parent.mkdir(parents=True, exist_ok=True)
        self._server = _UnixHTTPServer(socket_path, Handler, max_connections)
        self._thread = threading.Thread(target=self._server.serve, name="model-gateway", daemon=True)

    @classmethod
    def for_provider(
        cls,
        socket_path: Path,
        settings: Settings,
        provider: str,
        *,
        spent: Usage | None = None,
        model: str | None = None,
        max_tokens: int | None = None,
        server_tools: frozenset[str] = frozenset(),
        search_domains: tuple[str, ...] = (),
    ) -> ModelGateway:
        """The gateway for ``provider`` (one whose row in ``sandbox/providers.py`` has a gateway
        route) as ``settings`` configure it.

        ``spent``: what earlier attempts of the same run used (counted against the budget).
        ``model`` and ``max_tokens``: what the run may ask for (the pipeline passes its
        recorded input's); by default ``ORCHESTRATOR_MODEL``'s model when it names
        ``provider``, and ``ORCHESTRATOR_MAX_TOKENS``.
        """
        facts = facts_of(provider)
        if facts is None or facts.gateway is None:
            raise ValueError(f"no model gateway for provider {provider!r}")
        upstream = UPSTREAMS[facts.gateway]
        if model is None:
            named, model_id = split_spec(settings.model)
            model = model_id if named == provider and model_id else None
        limits: _Limits = {
            "model": model,
            "max_tokens": settings.max_tokens if max_tokens is None else max_tokens,
            "model_policy": settings.gateway_model_policy,
            "token_budget": settings.run_token_budget,
            "spent": spent,
            "max_request_bytes": settings.gateway_max_request_bytes,
            "max_connections": settings.gateway_max_connections,
            "read_timeout_s": settings.gateway_read_timeout_s,
        }
        return cls(
            socket_path,
            upstream=upstream.base_url(settings),
            api_key=upstream.api_key(settings),
            allowed_paths=upstream.paths,
            auth=upstream.auth,
            server_tools=server_tools,
            search_domains=search_domains,
            max_server_tool_requests=settings.gateway_max_server_tool_requests,
            **limits,
        )

    @property
    def usage(self) -> Usage:
        """The run's tokens so far (``spent`` included)."""
        with self._lock:
            return Usage(
                input_tokens=self.input_tokens,
                output_tokens=self.output_tokens,
                cache_read_input_tokens=self.cache_read_input_tokens,
                cache_creation_input_tokens=self.cache_creation_input_tokens,
            )

    @property
    def dropped(self) -> int:
        """Connections closed at once because ``max_connections`` were open."""
        return self._server.dropped

    def __enter__(self) -> ModelGateway:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        if self._thread.is_alive():
            self._server.stop()
            self._thread.join()
        self._server.server_close()  # also unlinks the socket
        # A request still being answered is cut; one waiting on the upstream
        # gets a moment to be counted.
        self._server.end_connections(wait_s=2.0)
        self._client.close()

    # -- request handling -----------------------------------------------------------

    def _answer_error(self, h: BaseHTTPRequestHandler, status: int, kind: str, message: str) -> None:
        with self._lock:
            self.refused += 1
        body = json.dumps({"type": "error", "error": {"type": kind, "message": message}}).encode()
        # The request's body is left unread: close the connection, or a
        # keep-alive client's next request would be parsed from it.
        h.close_connection = True
        try:
            h.send_response(status)
            h.send_header("content-type", "application/json")
            h.send_header("content-length", str(len(body)))
            h.send_header("connection", "close")
            h.end_headers()
            h.wfile.write(body)
        except OSError:
            pass  # the sandbox hung up

    def _refuse(self, h: BaseHTTPRequestHandler) -> None:
        self._answer_error(h, 403, "forbidden", "route not allowed by the gateway")

    def _content_length(self, h: BaseHTTPRequestHandler) -> int:
        if h.headers.get("transfer-encoding") is not None:
            raise _Refusal(411, "invalid_request_error", "the gateway takes no chunked bodies: send Content-Length")
        values = h.headers.get_all("content-length") or []
        if not values:
            raise _Refusal(411, "invalid_request_error", "Content-Length is required")
        value = values[0].strip()
        if len(values) > 1 or not (value.isascii() and value.isdigit()):
            raise _Refusal(400, "invalid_request_error", "Content-Length must be one non-negative number")
        if len(value) > 19 or int(value) > self.max_request_bytes:
            raise _Refusal(
                413, "request_too_large", f"the request is over the gateway's limit of {self.max_request_bytes} bytes"
            )
        return int(value)

    def _read_body(self, h: BaseHTTPRequestHandler, length: int) -> bytes:
        # Each read waits at most read_timeout_s; the whole body gets that long too.
        deadline = time.monotonic() + self.read_timeout_s
        chunks: list[bytes] = []
        left = length
        try:
            while left:
                if time.monotonic() > deadline:
                    raise TimeoutError
                chunk = h.rfile.read1(min(left, 1 << 20))
                if not chunk:
                    raise _Refusal(400, "invalid_request_error", "the body ended before its Content-Length")
                chunks.append(chunk)
                left -= len(chunk)
        except TimeoutError:
            raise _Refusal(408, "request_timeout", "the body did not arrive in time") from None
        return b"".join(chunks)

    def _prepare(self, path: str, body: bytes) -> bytes:
        """The body to send upstream: only fields and tools on the list, held to the run's
        model, output cap and budget."""
        wire = _wire_of(path)
        head, strip = _read_head(wire, body)
        # Fields the request lacks are added (first); fields it asks too much
        # with are changed, under the rewrite policy, by writing the top level anew.
        added: dict[str, object] = {}
        changed: dict[str, object] = {}
        self._hold_model(head, added, changed)
        self._hold_output(head, added, changed)
        _hold_head_fields(wire, head)
        opened = _hold_tools(wire, head.tools, self.server_tools if wire is _ANTHROPIC else frozenset())
        if opened:
            changed["tools"] = self._held_server_tools(head.tools, opened)
        scan = _Scan(body, head)
        _hold_sources(scan)
        if wire is _OPENAI and head.stream:
            # OpenAI streams report usage only when asked to.
            if not head.stream_options:
                added["stream_options"] = {"include_usage": True}
            else:
                try:
                    options = msgspec.json.decode(head.stream_options, type=_StreamOptions)
                except (msgspec.DecodeError, msgspec.ValidationError) as exc:
                    raise _Refusal(400, "invalid_request_error", f"stream_options: {exc}") from None
                if not options.include_usage:
                    raise _Refusal(
                        400,
                        "invalid_request_error",
                        "the gateway counts tokens: a stream needs stream_options.include_usage",
                    )
        if changed or strip or self._ambiguous(scan, head):
            return _rewritten(body, added, changed)
        if not added:
            return body
        # The body is never decoded whole here (a hostile one could be built
        # to blow up in memory): the added fields go in front of the others.
        rest = body.lstrip(b" \t\r\n")[1:]  # after the object's "{"
        comma = b"" if rest.lstrip(b" \t\r\n").startswith(b"}") else b","
        fields = b",".join(
            msgspec.json.encode(name) + b":" + msgspec.json.encode(value) for name, value in added.items()
        )
        return b"{" + fields + comma + rest

    def _held_server_tools(self, raw: msgspec.Raw, opened: list[int]) -> list[Any]:
        """The tools with each server tool the policy opened held to the group's domains, once
        the run's budget of such requests allows one more."""
        if not self.search_domains:
            raise _Refusal(
                403,
                "tool_not_allowed",
                "this group's network policy opens the provider's web search but names no domain it may "
                "search (orchestrator groups set --network allowlist:HOST,...)",
            )
        with self._lock:
            if self.server_tool_requests >= self.max_server_tool_requests:
                raise _Refusal(
                    403,
                    "server_tool_budget",
                    f"this run made its {self.max_server_tool_requests} requests with server tools "
                    "(ORCHESTRATOR_GATEWAY_MAX_SERVER_TOOL_REQUESTS): their fees are not tokens",
                )
            self.server_tool_requests += 1
        tools: list[Any] = msgspec.json.decode(raw)
        for index in opened:
            tool = dict(tools[index])
            # The provider searches the group's domains, whatever the sandbox asked.
            tool.pop("blocked_domains", None)
            tool["allowed_domains"] = list(self.search_domains)
            tools[index] = tool
        return tools

    def _hold_model(self, head: _Head, added: dict[str, object], changed: dict[str, object]) -> None:
        """The run's model, and no other."""
        if self.model is None or head.model == self.model:
            return
        if head.model is msgspec.UNSET:
            added["model"] = self.model
        elif self.model_policy == "rewrite":
            changed["model"] = self.model
        else:
            raise _Refusal(
                403,
                "model_not_allowed",
                f"this run may use the model {self.model!r} only, not {head.model!r} "
                "(ORCHESTRATOR_MODEL; with ORCHESTRATOR_GATEWAY_MODEL_POLICY=rewrite the gateway "
                "sends such a request with the run's model instead)",
            )

    def _hold_output(self, head: _Head, added: dict[str, object], changed: dict[str, object]) -> None:
        """The output cap: at most ``max_tokens`` an answer, and within what is left of the budget."""
        if self.max_tokens is None and not self.token_budget:
            return
        fields = {"max_tokens": head.max_tokens, "max_completion_tokens": head.max_completion_tokens}
        if None in fields.values():  # present but null: no cap, and we must not add a second one
            raise _Refusal(400, "invalid_request_error", "the gateway needs the output cap to be a number")
        caps = {name: value for name, value in fields.items() if isinstance(value, int)}
        if self.max_tokens is not None:
            for name, value in list(caps.items()):
                if value <= self.max_tokens:
                    continue
                if self.model_policy != "rewrite":
                    raise _Refusal(
                        403,
                        "max_tokens_not_allowed",
                        f"this run's answers are capped at {self.max_tokens} output tokens "
                        f"(ORCHESTRATOR_MAX_TOKENS); the request asks for {name}={value}",
                    )
                changed[name] = caps[name] = self.max_tokens
        choices = head.n if isinstance(head.n, int) and head.n > 1 else 1  # OpenAI: choices, each up to the cap
        cap = self.max_tokens
        if self.token_budget:
            with self._lock:
                left = self.token_budget - self.input_tokens - self.output_tokens
            if caps and (asked := max(caps.values()) * choices) > left:
                raise self._budget_refusal(
                    f"this run has {left} of its {self.token_budget} tokens left; the request asks for "
                    f"up to {asked} output tokens (ORCHESTRATOR_RUN_TOKEN_BUDGET)"
                )
            cap = max(1, left // choices) if cap is None else max(1, min(cap, left // choices))
        if not caps and cap is not None:
            added["max_tokens"] = cap

    def _budget_refusal(self, message: str) -> _Refusal:
        # 403, not 429: a provider must not retry this.
        with self._lock:
            self.budget_refusals += 1
        return _Refusal(403, "budget_exceeded", message)

    def _ambiguous(self, scan: _Scan, head: _Head) -> bool:
        """Could the upstream read a policed field otherwise than ``head`` did?

        Policed: the model and the output caps when the run is held to them,
        the tools (:func:`_hold_tools`) when there are any, and the messages
        (:func:`_hold_sources`).  Yes when one of their keys appears more (or
        less) often than once per field present, in any case (Go's
        encoding/json matches keys ignoring it), counting nested keys and
        string values alike (byte counts, not a parse: an overcount only costs
        a rewrite), or when the body could spell a key character another way
        (:data:`_ESCAPED_NAME_CHAR`).
        """
        policed: dict[str, bool] = {}
        if self.model is not None:
            policed["model"] = head.model is not msgspec.UNSET
        if self.max_tokens is not None or self.token_budget:
            policed["max_tokens"] = head.max_tokens is not msgspec.UNSET
            policed["max_completion_tokens"] = head.max_completion_tokens is not msgspec.UNSET
        if head.tools:
            policed["tools"] = True
        if head.messages:
            policed["messages"] = True
        if not policed:
            return False
        for name, present in policed.items():
            if scan.count(name.encode()) != present:
                return True
        return scan.respelled

    def _handle(self, h: BaseHTTPRequestHandler) -> None:
        # The query string is never passed on (the CLI sends ?beta=true: not a refusal).
        path = h.path.split("?", 1)[0]
        if path not in self.allowed_paths:
            self._refuse(h)
            return
        try:
            length = self._content_length(h)
            if not self._one_at_a_time.acquire(timeout=self._timeout_s):
                raise _Refusal(503, "overloaded_error", "the gateway serves one request at a time; try again")
        except _Refusal as r:
            self._answer_error(h, r.status, r.kind, r.message)
            return
        try:
            with self._lock:
                spent = self.input_tokens + self.output_tokens
            try:
                if self.token_budget and spent >= self.token_budget:
                    raise self._budget_refusal(
                        f"this run used {spent} tokens; its budget is {self.token_budget} "
                        "(ORCHESTRATOR_RUN_TOKEN_BUDGET)"
                    )
                body = self._read_body(h, length)
                # Checked once the body is read: a client that is still sending it
                # would meet a closed connection instead of the refusal.
                headers = _forwarded_headers(_wire_of(path), h)
                body = self._prepare(path, body)
            except _Refusal as r:
                self._answer_error(h, r.status, r.kind, r.message)
                return
            self._forward(h, path, headers, body)
        finally:
            self._one_at_a_time.release()

    def _forward(self, h: BaseHTTPRequestHandler, path: str, headers: dict[str, str], body: bytes) -> None:
        if self._auth == "bearer":
            if self._api_key:
                headers["authorization"] = f"Bearer {self._api_key}"
        else:
            headers["x-api-key"] = self._api_key
        meter = _Meter()
        charged = False

        def charge() -> None:
            # Once per answer, before its last byte goes out: a client that
            # has read the answer sees it counted.
            nonlocal charged
            if not charged:
                charged = True
                tokens_in, tokens_out = meter.tokens(len(body))
                cache_read, cache_creation = meter.cache_tokens()
                with self._lock:
                    self.input_tokens += tokens_in
                    self.output_tokens += tokens_out
                    self.cache_read_input_tokens += cache_read
                    self.cache_creation_input_tokens += cache_creation

        with self._lock:
            self.requests += 1
        status = 502
        try:
            with self._client.stream("POST", self.upstream + path, content=body, headers=headers) as resp:
                status = resp.status_code
                ctype = resp.headers.get("content-type", "application/json")
                if status == 200 and ctype.startswith("text/event-stream"):
                    self._relay_stream(h, resp, ctype, meter, charge)
                else:
                    content = resp.read()
                    if status == 200:
                        meter.response_bytes = len(content)
                        self._read_usage(content, meter)
                        charge()
                    if self._api_key and self._api_key.encode() in content:
                        # An upstream's error may echo the key it was sent ("Incorrect API key
                        # provided: sk-..."): the key never enters the container, not even so.
                        content = content.replace(self._api_key.encode(), b"[redacted]")
                    self._send(h, status, ctype, content, resp.headers.get("retry-after"))
        except httpx.HTTPError as exc:
            if status == 200:  # cut mid-answer: the headers are sent, the client sees the end
                h.close_connection = True
            else:
                message = f"gateway: upstream unreachable: {exc}"
                content = json.dumps({"type": "error", "error": {"type": "api_error", "message": message}}).encode()
                self._send(h, 502, "application/json", content, None)
        finally:
            if status == 200:
                charge()

    @staticmethod
    def _read_usage(content: bytes, meter: _Meter) -> None:
        try:
            answer = json.loads(content)
        except ValueError:
            return
        if isinstance(answer, dict):
            meter.see(answer.get("usage"), final=True)

    @staticmethod
    def _send(h: BaseHTTPRequestHandler, status: int, ctype: str, content: bytes, retry_after: str | None) -> None:
        try:
            h.send_response(status)
            h.send_header("content-type", ctype)
            h.send_header("content-length", str(len(content)))
            if retry_after:
                h.send_header("retry-after", retry_after)
            h.end_headers()
            h.wfile.write(content)
        except OSError:
            h.close_connection = True

    @staticmethod
    def _relay_stream(
        h: BaseHTTPRequestHandler, resp: httpx.Response, ctype: str, meter: _Meter, charge: Callable[[], None]
    ) -> None:
        """Pass an event stream on as it arrives (chunked), reading its usage on the way."""
        sse = _SseUsage(meter)
        chunked = h.request_version == "HTTP/1.1"
        try:
            h.send_response(200)
            h.send_header("content-type", ctype)
            h.send_header("cache-control", "no-cache")
            if chunked:
                h.send_header("transfer-encoding", "chunked")
            else:  # HTTP/1.0: the end of the stream is the end of the connection
                h.close_connection = True
            h.end_headers()
            for chunk in resp.iter_bytes():
                if not chunk:
                    continue
                sse.feed(chunk)
                h.wfile.write(b"%x\r\n%s\r\n" % (len(chunk), chunk) if chunked else chunk)
            charge()
            if chunked:
                h.wfile.write(b"0\r\n\r\n")
        except OSError:
            # The sandbox hung up: stop reading (the upstream stops generating)
            # and charge what arrived.
            h.close_connection = True


def _forwarded_headers(wire: _Wire, h: BaseHTTPRequestHandler) -> dict[str, str]:
    """The request's headers on ``wire``'s list (any other is dropped), its ``anthropic-beta``
    values all on the list, sent as one header (every line of it read, each value checked)."""
    headers = {
        name.lower(): value
        for name, value in h.headers.items()
        if name.lower() in wire.headers and name.lower() != "anthropic-beta"
    }
    if "anthropic-beta" not in wire.headers:
        return headers
    betas = [beta.strip() for line in h.headers.get_all("anthropic-beta") or () for beta in line.split(",")]
    betas = [beta for beta in betas if beta]
    for beta in betas:
        if beta not in wire.betas:
            raise _Refusal(
                403,
                "beta_not_allowed",
                f"the gateway does not forward the anthropic-beta value {beta!r}: a beta can have the "
                f"provider's servers reach the network (allowed: {', '.join(sorted(wire.betas))})",
            )
    if betas:
        headers["anthropic-beta"] = ",".join(betas)
    return headers


def _read_head(wire: _Wire, body: bytes) -> tuple[_Head, bool]:
    """``body``'s top level, every field on ``wire``'s list, and whether it has keys to leave
    out: those only a case-blind reader takes for a policed one (``Model``, see :func:`_rewritten`)."""
    try:
        return wire.decoder.decode(body), False
    except msgspec.ValidationError as exc:  # (a DecodeError too: first)
        strict = exc  # a field not on the list, or a value of the wrong type
    except (msgspec.DecodeError, RecursionError) as exc:
        raise _Refusal(400, "invalid_request_error", f"the gateway needs a JSON object: {exc}") from None
    try:
        head: _Head = _LENIENT.decode(body)
    except (msgspec.DecodeError, msgspec.ValidationError, RecursionError) as exc:
        raise _Refusal(400, "invalid_request_error", f"the gateway needs a JSON object: {exc}") from None
    if body.count(b":") > _MAX_REWRITE_COLONS:
        # Too many keys to go through, as for a rewrite (:func:`_rewritten`): msgspec named the first.
        raise _Refusal(
            413,
            "request_too_large",
            f"{strict}: the gateway reads through (and rewrites) the fields of requests with at most "
            f"{_MAX_REWRITE_COLONS} keys, and forwards only the fields on its list",
        )
    for name in _TOP_LEVEL.decode(body):
        if name in wire.fields or name in _HEAD_FIELDS or name.casefold() in _POLICED:
            continue
        raise _field_refusal(wire, name)
    return head, True


def _field_refusal(wire: _Wire, name: str) -> _Refusal:
    why = _REFUSED_FIELDS.get(name, "it is not on the gateway's list")
    return _Refusal(
        403,
        "field_not_allowed",
        f"the gateway does not forward the {wire.api} field {name!r}: {why} "
        f"(allowed: {', '.join(sorted(wire.fields))})",
    )


def _hold_head_fields(wire: _Wire, head: _Head) -> None:
    """The fields the gateway reads for either API (:class:`_Head`): only ``wire``'s own."""
    for name in _HEAD_FIELDS - wire.fields:
        value = getattr(head, name)
        if value is not msgspec.UNSET and not (isinstance(value, msgspec.Raw) and not value):
            raise _field_refusal(wire, name)


def _hold_tools(wire: _Wire, raw: msgspec.Raw, opened: frozenset[str] = frozenset()) -> list[int]:
    """Tools the agent runs itself, none the provider runs on its servers (they reach the network),
    but those whose type starts with one of ``opened`` (the group's network policy's): their
    indexes."""
    if not raw:
        return []
    # Each object or key takes 3 bytes at least ({} and a comma, "":0): a short list cannot
    # be over the bound, and is not counted (most are: Claude Code's are about 75 KB).
    if len(raw) > 3 * _MAX_TOOL_ITEMS:
        data = bytes(raw)  # (a Raw has no count)
        if data.count(b"{") + data.count(b":") > _MAX_TOOL_ITEMS:
            raise _Refusal(
                413,
                "request_too_large",
                f"the gateway reads each tool's type, in requests whose tools have at most "
                f"{_MAX_TOOL_ITEMS} objects and keys in all",
            )
    try:
        tools = _TOOLS.decode(raw)
    except (msgspec.DecodeError, msgspec.ValidationError) as exc:
        raise _Refusal(400, "invalid_request_error", f"tools: {exc}") from None
    server: list[int] = []
    for index, tool in enumerate(tools or ()):
        kind = _tool_type(tool, index)
        if kind is not None and kind not in wire.tool_types and any(kind.startswith(p) for p in opened):
            server.append(index)
            continue
        if kind not in wire.tool_types:
            allowed = " or ".join("no type" if t is None else repr(t) for t in sorted(wire.tool_types, key=str))
            raise _Refusal(
                403,
                "tool_not_allowed",
                f"the gateway does not forward tools[{index}] of type {kind!r}: the provider would run "
                f"it on its own servers (web search, web fetch, code execution, MCP reach the network); "
                f"a tool the agent runs itself has {allowed} (a group's network policy may open the "
                f"provider's web search: orchestrator groups set --network allowlist:...,server-tool:web_search)",
            )
    return server


def _tool_type(tool: dict[str, msgspec.Raw], index: int) -> str | None:
    """A tool's type (None: it has none), from its one key that a case-blind reader takes for "type"."""
    for key in tool:
        if key != "type" and key.casefold() == "type":
            raise _Refusal(
                403,
                "tool_not_allowed",
                f"tools[{index}] has a key {key!r}: a server that matches keys ignoring case would "
                'take it for the tool\'s type; spell it "type"',
            )
    if "type" not in tool:
        return None
    try:
        return _TOOL_TYPE.decode(tool["type"])
    except (msgspec.DecodeError, msgspec.ValidationError):
        raise _Refusal(400, "invalid_request_error", f"tools[{index}].type must be a string") from None


def _hold_sources(scan: _Scan) -> None:
    """No block of the messages names content kept elsewhere: a URL, which the provider (or the
    server behind an OpenAI-compatible API, or a relay in front of either) would fetch, or a
    file stored at the provider, which is not this run's (the gateway forwards no upload).
    Inline content passes: base64, text and content sources, data: URLs, base64 data.

    Most requests have no source key in their messages, in any case (the byte search of
    :attr:`_Scan.message_keys`), and are not decoded.  The others are read as their readers read
    them, twice: as they are (msgspec unescapes keys and takes the last of duplicates, as
    Python's json, pydantic and Go do), then folded (:func:`_folded`), as a reader that matches
    keys ignoring case reads them (Go's encoding/json: the last key that matches a name, a
    "Content" as "content").  A block with keys that only differ in case is so read both ways.
    """
    messages = scan.head.messages
    if not messages:
        return
    keys = scan.message_keys
    lowered, scan.lowered = scan.lowered, None
    if _capped(keys):
        raise _too_many_parts()
    folded: bytes | bytearray | None = None
    if scan.messages_respelled:  # keys the byte search does not see: the folded messages show them
        lowered = None
        folded = _folded(messages)
        keys = _keys(_QUOTED_KEY, folded)
    elif not any(keys[key] > 0 for key in _SOURCE_KEY_BYTES):
        return
    _bound_parts(scan.body, keys)
    _hold_messages(_decoded(_MESSAGES, messages, "messages"), folded=False)
    if folded is not None:
        read = _decoded(_MESSAGES, folded, "messages")
    elif lowered is not None:  # the body lowered: its messages are the messages lowered
        read = _decoded(_LOWERED_BODY, lowered, "messages").messages or []
    else:
        read = _decoded(_MESSAGES, bytes(messages).lower(), "messages")
    _hold_messages(read, folded=True)


def _folded(messages: msgspec.Raw) -> bytes | bytearray:
    """The messages with their keys as a reader that matches them ignoring case sees them:
    lowered, the Kelvin sign and long s as "k" and "s", an escaped name character written as
    itself (values change too: they are only read, never sent).  At most two copies of the
    messages are held at once."""
    folded = bytes(messages).lower()
    if not folded.isascii():
        for char, letter in zip(_GO_FOLDED, (b"k", b"s"), strict=True):
            if char[-1:] in folded:
                folded = folded.replace(char, letter)
    if _ESCAPED_NAME_CHAR.search(folded) is None:
        return folded
    view = memoryview(folded)
    out = bytearray()
    last = 0
    for seen, match in enumerate(_ESCAPED_NAME_CHAR.finditer(folded)):
        if seen == _MAX_COUNTED:
            raise _Refusal(
                413,
                "request_too_large",
                f"the gateway reads messages with escaped letters (or text "
                f"that looks so) in requests with at most {_MAX_COUNTED} of them",
            )
        if _backslashes_before(folded, match.start()) % 2:  # "\\u0041": a backslash, then the text "u0041"
            continue
        out += view[last : match.start()]
        out += _UNESCAPED[match[0]]
        last = match.end()
    out += view[last:]
    return out


# An escaped name character (lowered) as a reader that matches keys ignoring case reads it: the
# character itself, lowered (a backslash stays escaped).
_UNESCAPED = {b"\\u%04x" % code: (b"\\\\" if code == 0x5C else bytes([code]).lower()) for code in range(0x40, 0x80)}
_UNESCAPED |= {b"\\u212a": b"k", b"\\u017f": b"s"}


def _backslashes_before(data: bytes, end: int) -> int:
    """How many backslashes end ``data[:end]`` (a long run is searched a block at a time)."""
    count = 0
    size = 16
    while end > 0 and data[end - 1] == 0x5C:
        block = data[max(0, end - size) : end]
        run = len(block) - len(block.rstrip(b"\\"))
        count += run
        end -= run
        size = 4096
    return count


def _bound_parts(body: bytes, keys: collections.Counter[bytes]) -> None:
    """Refuse a request whose messages would build over :data:`_MAX_PARTS` objects or source
    keys when read (the body's objects are counted: an overcount, with no copy of the messages)."""
    if _capped(keys) or sum(keys[key] for key in _SOURCE_KEY_BYTES) > _MAX_PARTS:
        raise _too_many_parts()
    if len(body) <= 2 * _MAX_PARTS or body.count(b"{") <= _MAX_PARTS:  # {} is an object: 2 bytes
        return
    for seen, _ in enumerate(_OBJECT_START.finditer(body)):  # the '{' in strings left out
        if seen == _MAX_PARTS:
            raise _too_many_parts()


def _too_many_parts() -> _Refusal:
    return _Refusal(
        413,
        "request_too_large",
        f"the gateway reads the blocks of messages that have source keys, in requests with at most "
        f"{_MAX_PARTS} objects and source keys",
    )


_T = TypeVar("_T")


def _decoded(decoder: msgspec.json.Decoder[_T], data: bytes | bytearray | msgspec.Raw, where: str) -> _T:
    try:
        return decoder.decode(data)
    except (msgspec.DecodeError, msgspec.ValidationError) as exc:
        raise _Refusal(
            400,
            "invalid_request_error",
            f"{where}: {exc} (the gateway reads messages, and lists of blocks, as objects)",
        ) from None


def _hold_messages(messages: list[_Message], *, folded: bool) -> None:
    # _hold_list's loop, with the place named only when a block is read further: a long
    # session has thousands of blocks, and most are passed over.
    for index, message in enumerate(messages):
        if type(parts := message.content) is not list:  # a string, or none
            continue
        for number, part in enumerate(parts):
            if _names_a_source(part):
                _hold_part(part, f"messages[{index}].content[{number}]", 1, folded=folded)
            elif (content := part.content) and memoryview(content)[0] == 0x5B:  # '[': blocks
                _hold_blocks_in(content, f"messages[{index}].content[{number}].content", 1, folded=folded)


def _hold_list(parts: list[_Part], where: str, depth: int, *, folded: bool) -> None:
    """A list of blocks at ``where``, ``depth`` lists deep."""
    for index, part in enumerate(parts):
        if _names_a_source(part):
            _hold_part(part, f"{where}[{index}]", depth, folded=folded)
        elif (content := part.content) and memoryview(content)[0] == 0x5B:  # '[': blocks
            _hold_blocks_in(content, f"{where}[{index}].content", depth, folded=folded)


def _names_a_source(part: _Part) -> bool:
    # One expression: a loop over the names took three times as long, and most parts have none.
    return bool(
        part.source
        or part.url
        or part.image_url
        or part.audio_url
        or part.video_url
        or part.file_url
        or part.document_url
        or part.input_audio
        or part.file
        or part.file_id
        or part.file_data
    )


def _hold_blocks_in(content: msgspec.Raw, where: str, depth: int, *, folded: bool) -> None:
    """A block's list of blocks (a tool_result's content, a document's content source)."""
    if depth == _MAX_SOURCE_DEPTH:
        raise _Refusal(
            400,
            "invalid_request_error",
            f"{where} nests blocks deeper than the gateway reads ({_MAX_SOURCE_DEPTH} lists)",
        )
    _hold_list(_decoded(_PARTS, content, where), where, depth + 1, folded=folded)


def _hold_part(part: _Part, where: str, depth: int, *, folded: bool) -> None:
    """A block that has a source key: every such key holds inline content."""

    def refuse(why: str) -> _Refusal:
        if folded:  # not so as the keys are spelled: one differs from its name in case only
            why += (
                " (read so by a server that matches keys ignoring case, as Go's encoding/json does: a key "
                "here differs from its name in case only)"
            )
        return _Refusal(403, "source_not_allowed", f"the gateway does not forward {where}: {why}")

    lists = [("content", part.content)]
    if part.source and (source := _hold_source(part.source, refuse)) is not None:
        lists.append(("source.content", source.content))
    for name in _URL_KEYS:
        if raw := getattr(part, name):
            _hold_media(raw, name, refuse, url=True)
    for name in _DATA_KEYS:
        if raw := getattr(part, name):
            _hold_media(raw, name, refuse, url=False)
    if part.file_id and bytes(part.file_id) != b"null":
        raise refuse(_FILE_ID.format(key="file_id"))
    for key, content in lists:
        if content and memoryview(content)[0] == 0x5B:  # '[': blocks (a string or null holds none)
            _hold_blocks_in(content, f"{where}.{key}", depth, folded=folded)


_FILE_ID = (
    "its {key!r} names a file stored at the provider, which is not this run's (the gateway forwards "
    "no upload); send the content inline"
)


def _hold_source(raw: msgspec.Raw, refuse: Callable[[str], _Refusal]) -> _Source | None:
    """A block's source: inline (base64, text, content), or a string (a search result's, which
    names where the text came from; nothing fetches it)."""
    try:
        source = _SOURCE.decode(raw)
    except (msgspec.DecodeError, msgspec.ValidationError):
        raise refuse("its source is neither an object nor a string") from None
    if not isinstance(source, _Source):
        return None
    try:
        kind = _TOOL_TYPE.decode(source.type) if source.type else None
    except (msgspec.DecodeError, msgspec.ValidationError):
        raise refuse("its source's type is not a string") from None
    if kind not in _INLINE_SOURCE_TYPES:
        why = {
            "url": "the provider would fetch it",
            "file": "it names a file stored at the provider, which is not this run's (the gateway forwards no upload)",
        }.get(kind or "", "it is not on the gateway's list")
        if kind == "url" and source.url:
            with contextlib.suppress(msgspec.DecodeError, msgspec.ValidationError):
                why += f" ({_TOOL_TYPE.decode(source.url)[:200]!r})"
        raise refuse(
            f"its source is of type {kind!r}: {why}; send the content inline (a base64, text or content source)"
        )
    for name in (*_URL_KEYS, *_DATA_KEYS, "file_id", "source"):
        if getattr(source, name):
            raise refuse(f"its {kind} source has a {name!r} key, which a server could read instead")
    return source


def _hold_media(raw: msgspec.Raw, name: str, refuse: Callable[[str], _Refusal], *, url: bool) -> None:
    """A part's URL (``url``: only a data: URL is inline) or data (base64, or a data: URL), a
    string or an object that holds it."""
    try:
        value = _MEDIA.decode(raw)
    except (msgspec.DecodeError, msgspec.ValidationError):
        raise refuse(f"its {name!r} is neither a string nor an object") from None
    if value is None:
        return
    if isinstance(value, str):
        if _remote(value, url=url):
            raise refuse(_FETCHED.format(key=name, value=value[:200]))
        return
    for key, is_url in (("url", True), ("file_url", True), ("data", False), ("file_data", False)):
        if not (inner := getattr(value, key)):
            continue
        try:
            text = _MEDIA.decode(inner)
        except (msgspec.DecodeError, msgspec.ValidationError):
            raise refuse(f"its '{name}.{key}' is not a string") from None
        if isinstance(text, str) and _remote(text, url=is_url):
            raise refuse(_FETCHED.format(key=f"{name}.{key}", value=text[:200]))
        if isinstance(text, _Media):
            raise refuse(f"its '{name}.{key}' is not a string")
    if value.file_id and bytes(value.file_id) != b"null":
        raise refuse(_FILE_ID.format(key=f"{name}.file_id"))


_FETCHED = "its {key!r} is {value!r}: the server would fetch it; send the content inline (a data: URL, or base64 data)"


def _remote(value: str, *, url: bool) -> bool:
    """Does a URL (``url``) or a data field name content elsewhere?  Anything but a data: URL
    for a URL; anything with a scheme but data: for data (base64 has no ':')."""
    if value.lstrip(_URL_LEADING)[:5].lower() == "data:":
        return False
    return url or ":" in value


def _rewritten(body: bytes, added: dict[str, object], changed: dict[str, object]) -> bytes:
    """``body`` with its top level written anew: ``added`` first, then its own keys (each
    once, the last value of a duplicate, as :class:`_Head` read it), ``changed`` replaced,
    and keys that only a case-blind reader takes for a policed one (``Model``) left out.
    Every value but those is passed on byte for byte (msgspec's Raw: never decoded)."""
    if body.count(b":") > _MAX_REWRITE_COLONS:
        raise _Refusal(
            413,
            "request_too_large",
            f"the gateway must rewrite this request's fields, and does so for requests with at "
            f"most {_MAX_REWRITE_COLONS} keys; send the run's model and output cap as they are",
        )
    try:
        top = msgspec.json.decode(body, type=dict[str, msgspec.Raw])
    except (msgspec.DecodeError, msgspec.ValidationError) as exc:
        raise _Refusal(400, "invalid_request_error", f"the gateway needs a JSON object: {exc}") from None
    out = {name: msgspec.Raw(msgspec.json.encode(value)) for name, value in added.items()}
    for name, raw in top.items():
        if name not in _POLICED and name.casefold() in _POLICED:
            continue
        out[name] = msgspec.Raw(msgspec.json.encode(changed[name])) if name in changed else raw
    return msgspec.json.encode(out)
