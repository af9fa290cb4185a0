"""The request policy: a table of named rules (:data:`RULES`), run in order on every request
the sandbox sends, each a function that refuses the request (raises :class:`Refusal`) or
notes what to add to it or change in it.

The gateway decides what a run may ask for (``model``, ``max_tokens``: the host's
settings, passed in by the pipeline): a request that names another model, or asks for a
larger output cap, is refused (403, saying what is allowed) or, under the ``rewrite``
policy, sent with the host's values instead; and what a request may carry (the lists of
``allowlists.py``): only headers, fields and tools its clients were seen to send, and
content inline.  The first rule that refuses answers the request with an error that says
why, and nothing goes upstream.

docs/sandbox.md ("The model gateway") has the table: each rule's name and the first
paragraph of its function's docstring (:attr:`Rule.meaning`); tests/host/test_gateway_rules.py
holds the two equal and tests each rule on its own.
"""

from __future__ import annotations

import functools
import inspect
from collections.abc import Callable
from dataclasses import dataclass
from email.message import Message
from typing import Any

import msgspec

from . import sources
from .config import GatewayConfig
from .metering import Account
from .refusal import Refusal
from .rewrite import upstream_body
from .scan import Scan
from .wire import (
    ANTHROPIC,
    HEAD_FIELDS,
    OPENAI,
    Head,
    StreamOptions,
    field_refusal,
    forwarded_headers,
    read_head,
    read_tools,
    wire_of,
)


class Request:
    """One request as the rules read it, and what they decide for it."""

    def __init__(self, path: str, headers: Message, config: GatewayConfig, account: Account) -> None:
        self.path = path
        self.wire = wire_of(path)
        self.headers = headers
        self.config = config
        self.account = account
        self.body = b""  # read once the rules that need none have passed
        self.head = Head()  # read by the "fields" rule
        self.forwarded: dict[str, str] = {}  # the headers that go upstream
        # Fields the request lacks are added (first); fields it asks too much with are
        # changed, under the rewrite policy, by writing the top level anew.
        self.added: dict[str, object] = {}
        self.changed: dict[str, object] = {}
        self.rewrite = False  # its top level is written anew even with nothing changed
        self.opened: list[int] = []  # the tools the provider runs that the group's policy opens

    @functools.cached_property
    def scan(self) -> Scan:
        return Scan(self.body, self.head)


@dataclass(frozen=True, slots=True)
class Rule:
    """A named rule: ``hold`` refuses a request (raises :class:`Refusal`) or notes what to add
    or change; ``before_body``: it reads no body, and runs before the body is read (a request
    it refuses is answered with its body unread)."""

    name: str
    hold: Callable[[Request], None]
    before_body: bool = False

    @property
    def meaning(self) -> str:
        """What the rule holds, in one line: the first paragraph of its function's docstring."""
        doc = inspect.getdoc(self.hold) or ""
        return " ".join(doc.split("\n\n", 1)[0].split())


def hold_budget_left(req: Request) -> None:
    """A run that has spent its token budget sends nothing more (403 ``budget_exceeded``)."""
    budget = req.config.token_budget
    if budget and (spent := req.account.spent()) >= budget:
        raise req.account.budget_refusal(
            f"this run used {spent} tokens; its budget is {budget} (ORCHESTRATOR_RUN_TOKEN_BUDGET)"
        )


def hold_headers(req: Request) -> None:
    """Only headers on the API's list go upstream, any other is dropped; an ``anthropic-beta``
    value not on its list is refused (403 ``beta_not_allowed``)."""
    req.forwarded = forwarded_headers(req.wire, req.headers)


def hold_fields(req: Request) -> None:
    """The body is a JSON object (else 400) whose top-level fields are all on the API's list
    (403 ``field_not_allowed``), read as its upstream reads it."""
    req.head, req.rewrite = read_head(req.wire, req.body)


def hold_model(req: Request) -> None:
    """The run's model and no other (403 ``model_not_allowed``, or sent with the run's model
    under the ``rewrite`` policy); added when the request names none."""
    head, model = req.head, req.config.model
    if model is None or head.model == model:
        return
    if head.model is msgspec.UNSET:
        req.added["model"] = model
    elif req.config.model_policy == "rewrite":
        req.changed["model"] = model
    else:
        raise Refusal(
            403,
            "model_not_allowed",
            f"this run may use the model {model!r} only, not {head.model!r} "
            "(ORCHESTRATOR_MODEL; with ORCHESTRATOR_GATEWAY_MODEL_POLICY=rewrite the gateway "
            "sends such a request with the run's model instead)",
        )


def hold_output_cap(req: Request) -> None:
    """At most the run's ``max_tokens`` an answer (403 ``max_tokens_not_allowed``, or rewritten),
    and no more than is left of its token budget (403 ``budget_exceeded``); added when the
    request asks for no cap."""
    head, config = req.head, req.config
    max_tokens, budget = config.max_tokens, config.token_budget
    if max_tokens is None and not budget:
        return
    fields = {"max_tokens": head.max_tokens, "max_completion_tokens": head.max_completion_tokens}
    if None in fields.values():  # present but null: no cap, and we must not add a second one
        raise Refusal(400, "invalid_request_error", "the gateway needs the output cap to be a number")
    caps = {name: value for name, value in fields.items() if isinstance(value, int)}
    if max_tokens is not None:
        for name, value in list(caps.items()):
            if value <= max_tokens:
                continue
            if config.model_policy != "rewrite":
                raise Refusal(
                    403,
                    "max_tokens_not_allowed",
                    f"this run's answers are capped at {max_tokens} output tokens "
                    f"(ORCHESTRATOR_MAX_TOKENS); the request asks for {name}={value}",
                )
            req.changed[name] = caps[name] = max_tokens
    choices = head.n if isinstance(head.n, int) and head.n > 1 else 1  # OpenAI: choices, each up to the cap
    cap = max_tokens
    if budget:
        left = budget - req.account.spent()
        if caps and (asked := max(caps.values()) * choices) > left:
            raise req.account.budget_refusal(
                f"this run has {left} of its {budget} tokens left; the request asks for "
                f"up to {asked} output tokens (ORCHESTRATOR_RUN_TOKEN_BUDGET)"
            )
        cap = max(1, left // choices) if cap is None else max(1, min(cap, left // choices))
    if not caps and cap is not None:
        req.added["max_tokens"] = cap


def hold_api_fields(req: Request) -> None:
    """A field the gateway reads for either API (``n``, ``stream_options``, ...) only on the API
    that has it (403 ``field_not_allowed``)."""
    for name in HEAD_FIELDS - req.wire.fields:
        value = getattr(req.head, name)
        if value is not msgspec.UNSET and not (isinstance(value, msgspec.Raw) and not value):
            raise field_refusal(req.wire, name)


def hold_tools(req: Request) -> None:
    """Only tools the agent runs itself: a tool the provider runs on its own servers (web search,
    web fetch, code execution, MCP) is refused (403 ``tool_not_allowed``) unless the group's
    network policy opens it."""
    opened = req.config.server_tools if req.wire is ANTHROPIC else frozenset()
    req.opened = read_tools(req.wire, req.head.tools, opened)


def hold_server_tools(req: Request) -> None:
    """A server tool the group's network policy opens searches the group's domains only, in at
    most ``ORCHESTRATOR_GATEWAY_MAX_SERVER_TOOL_REQUESTS`` requests a run (403
    ``server_tool_budget``)."""
    if not req.opened:
        return
    config = req.config
    if not config.search_domains:
        raise Refusal(
            403,
            "tool_not_allowed",
            "this group's network policy opens the provider's web search but names no domain it may "
            "search (orchestrator groups set --network allowlist:HOST,...)",
        )
    if not req.account.take_server_tool_request(config.max_server_tool_requests):
        raise Refusal(
            403,
            "server_tool_budget",
            f"this run made its {config.max_server_tool_requests} requests with server tools "
            "(ORCHESTRATOR_GATEWAY_MAX_SERVER_TOOL_REQUESTS): their fees are not tokens",
        )
    tools: list[Any] = msgspec.json.decode(req.head.tools)
    for index in req.opened:
        tool = dict(tools[index])
        # The provider searches the group's domains, whatever the sandbox asked.
        tool.pop("blocked_domains", None)
        tool["allowed_domains"] = list(config.search_domains)
        tools[index] = tool
    req.changed["tools"] = tools


def hold_sources(req: Request) -> None:
    """No block of the messages names content kept elsewhere, a URL the provider would fetch or a
    file stored at the provider (403 ``source_not_allowed``): content goes inline."""
    sources.hold_sources(req.scan)


def hold_stream_usage(req: Request) -> None:
    """A Chat Completions stream reports its usage: ``stream_options.include_usage`` is added
    when absent, and a stream that turns it off is refused (400)."""
    head = req.head
    if req.wire is not OPENAI or not head.stream:
        return
    if not head.stream_options:
        req.added["stream_options"] = {"include_usage": True}
        return
    try:
        options = msgspec.json.decode(head.stream_options, type=StreamOptions)
    except (msgspec.DecodeError, msgspec.ValidationError) as exc:
        raise Refusal(400, "invalid_request_error", f"stream_options: {exc}") from None
    if not options.include_usage:
        raise Refusal(
            400, "invalid_request_error", "the gateway counts tokens: a stream needs stream_options.include_usage"
        )


def hold_one_reading(req: Request) -> None:
    """A body whose policed keys (``model``, the output caps, ``tools``, ``messages``) could be
    read another way (twice, in another case, with escapes) has its top level written anew:
    the upstream gets one copy of each key, the one checked.

    Policed: the model and the output caps when the run is held to them, the tools and the
    messages when there are any.  Ambiguous when one of their keys appears more (or less)
    often than once per field present, in any case (Go's encoding/json matches keys ignoring
    it), counting nested keys and string values alike (byte counts, not a parse: an
    overcount only costs a rewrite), or when the body could spell a key character another
    way (``scan.respelled_in``).  A body already written anew is not searched.
    """
    if req.changed or req.rewrite:
        return
    head, config = req.head, req.config
    policed: dict[str, bool] = {}
    if config.model is not None:
        policed["model"] = head.model is not msgspec.UNSET
    if config.max_tokens is not None or config.token_budget:
        policed["max_tokens"] = head.max_tokens is not msgspec.UNSET
        policed["max_completion_tokens"] = head.max_completion_tokens is not msgspec.UNSET
    if head.tools:
        policed["tools"] = True
    if head.messages:
        policed["messages"] = True
    if not policed:
        return
    scan = req.scan
    req.rewrite = any(scan.count(name.encode()) != present for name, present in policed.items()) or scan.respelled


# The policy, in the order it runs: the cheap checks first, the messages (the bulk of a
# long session) last but one.
RULES: tuple[Rule, ...] = (
    Rule("budget_left", hold_budget_left, before_body=True),
    Rule("headers", hold_headers),
    Rule("fields", hold_fields),
    Rule("model", hold_model),
    Rule("output_cap", hold_output_cap),
    Rule("api_fields", hold_api_fields),
    Rule("tools", hold_tools),
    Rule("server_tools", hold_server_tools),
    Rule("sources", hold_sources),
    Rule("stream_usage", hold_stream_usage),
    Rule("one_reading", hold_one_reading),
)


def hold_before_body(req: Request) -> None:
    """The rules that read no body."""
    for rule in RULES:
        if rule.before_body:
            rule.hold(req)


def prepare(req: Request) -> bytes:
    """The rules that read the body, then the body to send upstream."""
    for rule in RULES:
        if not rule.before_body:
            rule.hold(req)
    return upstream_body(req.body, req.added, req.changed, rewrite=req.rewrite)
