"""A request as its API's upstream reads it: the top level (:class:`Head`, :func:`read_head`),
the headers and the tools, each read against the API's lists (``allowlists.py``).

The body is read as the upstream reads it: msgspec takes the last of duplicate keys and
unescapes them, as Python's json, Go's encoding/json and pydantic do, so a field not on
the list is refused however it is spelled.  Only the fields the gateway acts on are
built; every other is passed over (``msgspec.Raw``: never decoded).
"""

from __future__ import annotations

from dataclasses import dataclass
from email.message import Message
from typing import Any

import msgspec

from .allowlists import (
    ANTHROPIC_BETAS,
    ANTHROPIC_FIELDS,
    ANTHROPIC_HEADERS,
    ANTHROPIC_TOOL_TYPES,
    OPENAI_FIELDS,
    OPENAI_HEADERS,
    OPENAI_TOOL_TYPES,
    REFUSED_FIELDS,
)
from .refusal import Refusal
from .upstream import OPENAI_PATHS

# The request fields the gateway holds to the host's settings.
POLICED = ("model", "max_tokens", "max_completion_tokens")
# Writing a body's top level anew decodes it into a dict of raw values: its
# cost grows with the top-level keys, which a hostile body could have by the
# million.  Every key is followed by a ':', so this many colons bounds it
# (about 0.3 s and 20 MB at worst); a real request has a handful of top-level
# keys and far fewer colons.
MAX_REWRITE_COLONS = 200_000
# Reading the tools' types builds an object for each tool and key: a hostile list of millions of
# tiny tools ([{},{},...]) would cost hundreds of MB.  Every tool is an object and every key is
# followed by a ':', so this many of both bound it (a few MB and ~20 ms at worst); Claude Code's
# 17 tools have under 800.
_MAX_TOOL_ITEMS = 50_000


class Head(msgspec.Struct):
    """The top-level fields of a request the gateway acts on; msgspec skips the rest without building it.

    UNSET (absent) and None (null) differ: only an absent field may be added.
    """

    model: str | None | msgspec.UnsetType = msgspec.UNSET
    stream: bool | None = None
    max_tokens: int | None | msgspec.UnsetType = msgspec.UNSET
    max_completion_tokens: int | None | msgspec.UnsetType = msgspec.UNSET  # OpenAI's newer name
    n: int | None | msgspec.UnsetType = msgspec.UNSET  # OpenAI: choices, each up to the output cap
    stream_options: msgspec.Raw = msgspec.Raw()  # empty: absent
    tools: msgspec.Raw = msgspec.Raw()  # read by read_tools
    messages: msgspec.Raw = msgspec.Raw()  # read by sources.hold_sources


HEAD_FIELDS = frozenset(Head.__struct_fields__)


class StreamOptions(msgspec.Struct):
    include_usage: bool | None = None


@dataclass(frozen=True)
class Wire:
    """What a request of one API may carry."""

    api: str
    headers: frozenset[str]
    betas: frozenset[str]
    fields: frozenset[str]
    tool_types: frozenset[str | None]
    # The body's top level as a Head whose other fields are on the list (msgspec.Raw: passed
    # over, never built); a field not on the list fails the decode, however it is spelled
    # (msgspec unescapes keys, and matches them exactly).
    decoder: msgspec.json.Decoder[Any]


def _wire(
    api: str, headers: frozenset[str], betas: frozenset[str], fields: frozenset[str], tool_types: frozenset[str | None]
) -> Wire:
    listed = [(name, msgspec.Raw, msgspec.Raw()) for name in sorted(fields - HEAD_FIELDS)]
    head = msgspec.defstruct(f"_{api.replace(' ', '')}Head", listed, bases=(Head,), forbid_unknown_fields=True)
    return Wire(api, headers, betas, fields, tool_types, msgspec.json.Decoder(head))


ANTHROPIC = _wire("Messages API", ANTHROPIC_HEADERS, ANTHROPIC_BETAS, ANTHROPIC_FIELDS, ANTHROPIC_TOOL_TYPES)
OPENAI = _wire("Chat Completions", OPENAI_HEADERS, frozenset(), OPENAI_FIELDS, OPENAI_TOOL_TYPES)
_LENIENT = msgspec.json.Decoder(Head)
_TOP_LEVEL = msgspec.json.Decoder(dict[str, msgspec.Raw])
_TOOLS = msgspec.json.Decoder(list[dict[str, msgspec.Raw]] | None)
_STRING = msgspec.json.Decoder(str)


def wire_of(path: str) -> Wire:
    return OPENAI if path in OPENAI_PATHS else ANTHROPIC


def forwarded_headers(wire: Wire, headers: Message) -> dict[str, str]:
    """The request's headers on ``wire``'s list (any other is dropped), its ``anthropic-beta``
    values all on the list, sent as one header (every line of it read, each value checked)."""
    forwarded = {
        name.lower(): value
        for name, value in headers.items()
        if name.lower() in wire.headers and name.lower() != "anthropic-beta"
    }
    if "anthropic-beta" not in wire.headers:
        return forwarded
    betas = [beta.strip() for line in headers.get_all("anthropic-beta") or () for beta in line.split(",")]
    betas = [beta for beta in betas if beta]
    for beta in betas:
        if beta not in wire.betas:
            raise Refusal(
                403,
                "beta_not_allowed",
                f"the gateway does not forward the anthropic-beta value {beta!r}: a beta can have the "
                f"provider's servers reach the network (allowed: {', '.join(sorted(wire.betas))})",
            )
    if betas:
        forwarded["anthropic-beta"] = ",".join(betas)
    return forwarded


def read_head(wire: Wire, body: bytes) -> tuple[Head, bool]:
    """``body``'s top level, every field on ``wire``'s list, and whether it has keys to leave
    out: those only a case-blind reader takes for a policed one (``Model``, see
    ``rewrite.rewritten``)."""
    try:
        return wire.decoder.decode(body), False
    except msgspec.ValidationError as exc:  # (a DecodeError too: first)
        strict = exc  # a field not on the list, or a value of the wrong type
    except (msgspec.DecodeError, RecursionError) as exc:
        raise Refusal(400, "invalid_request_error", f"the gateway needs a JSON object: {exc}") from None
    try:
        head: Head = _LENIENT.decode(body)
    except (msgspec.DecodeError, msgspec.ValidationError, RecursionError) as exc:
        raise Refusal(400, "invalid_request_error", f"the gateway needs a JSON object: {exc}") from None
    if body.count(b":") > MAX_REWRITE_COLONS:
        # Too many keys to go through, as for a rewrite (rewrite.rewritten): msgspec named the first.
        raise Refusal(
            413,
            "request_too_large",
            f"{strict}: the gateway reads through (and rewrites) the fields of requests with at most "
            f"{MAX_REWRITE_COLONS} keys, and forwards only the fields on its list",
        )
    for name in _TOP_LEVEL.decode(body):
        if name in wire.fields or name in HEAD_FIELDS or name.casefold() in POLICED:
            continue
        raise field_refusal(wire, name)
    return head, True


def field_refusal(wire: Wire, name: str) -> Refusal:
    why = REFUSED_FIELDS.get(name, "it is not on the gateway's list")
    return Refusal(
        403,
        "field_not_allowed",
        f"the gateway does not forward the {wire.api} field {name!r}: {why} "
        f"(allowed: {', '.join(sorted(wire.fields))})",
    )


def read_tools(wire: Wire, raw: msgspec.Raw, opened: frozenset[str] = frozenset()) -> list[int]:
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
            raise Refusal(
                413,
                "request_too_large",
                f"the gateway reads each tool's type, in requests whose tools have at most "
                f"{_MAX_TOOL_ITEMS} objects and keys in all",
            )
    try:
        tools = _TOOLS.decode(raw)
    except (msgspec.DecodeError, msgspec.ValidationError) as exc:
        raise Refusal(400, "invalid_request_error", f"tools: {exc}") from None
    server: list[int] = []
    for index, tool in enumerate(tools or ()):
        kind = _tool_type(tool, index)
        if kind is not None and kind not in wire.tool_types and any(kind.startswith(p) for p in opened):
            server.append(index)
            continue
        if kind not in wire.tool_types:
            allowed = " or ".join("no type" if t is None else repr(t) for t in sorted(wire.tool_types, key=str))
            raise Refusal(
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
            raise Refusal(
                403,
                "tool_not_allowed",
                f"tools[{index}] has a key {key!r}: a server that matches keys ignoring case would "
                'take it for the tool\'s type; spell it "type"',
            )
    if "type" not in tool:
        return None
    try:
        return _STRING.decode(tool["type"])
    except (msgspec.DecodeError, msgspec.ValidationError):
        raise Refusal(400, "invalid_request_error", f"tools[{index}].type must be a string") from None
