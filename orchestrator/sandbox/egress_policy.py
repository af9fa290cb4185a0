"""A group's network policy: which hosts its sandbox may reach through the egress proxy.

The container never has a network device besides loopback (``ContainerConfig.network`` is
always ``none``); its one way out is the host's egress proxy (``sandbox/egress/``), which
asks this policy about every request:

* ``off`` (the default): nothing goes out;
* ``allowlist``: the hosts the rules name, and the presets' (each a documented list below);
* ``ask``: an allowlist, and a request to a host not on it is refused at once, and the chat
  is asked whether to allow that host for the group (``run/egress_questions.py``): once
  allowed, a later run's request goes through; nothing waits meanwhile.

A rule is a host name (``files.internal.test``), a name with every name below it
(``*.github.com``: ``api.github.com``, not ``github.com`` itself), either with a port
(``example.com:8443``); without one, any port.  Names are compared lowercased, without a
trailing dot; an IP address is never a rule (nor a target: the proxy refuses literals).
A target is a name a rule can name exactly (:func:`host_name`, :func:`port_number`): the
proxy refuses any other before it decides or asks, so an Allow never adds ``*.com``.
``methods`` limits the HTTP methods (a CONNECT tunnel counts as its target's method is not
seen: allowed only when ``CONNECT`` is among them or no limit is set), ``max_requests``
and ``max_bytes`` a run's requests and bytes (both ways).
"""

from __future__ import annotations

import re
import socket
from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from orchestrator.core.jsontypes import WHOLE_NUMBER

EgressMode = Literal["off", "allowlist", "ask"]
Preset = Literal["package-indexes", "git-hosts"]
Method = Literal["GET", "HEAD", "POST", "PUT", "PATCH", "DELETE", "OPTIONS", "CONNECT"]
# Tools the model's provider runs on its own servers that a policy may open (the gateway
# refuses every server tool otherwise): name -> the tool types' prefix in the Messages API.
ServerTool = Literal["web_search"]
SERVER_TOOLS: dict[str, str] = {"web_search": "web_search_"}

# The presets' hosts: what a package manager or a git client reaches for the public indexes.
PRESETS: dict[str, tuple[str, ...]] = {
    "package-indexes": (
        "pypi.org",
        "files.pythonhosted.org",
        "registry.npmjs.org",
        "registry.yarnpkg.com",
        "crates.io",
        "static.crates.io",
        "index.crates.io",
        "proxy.golang.org",
        "sum.golang.org",
        "rubygems.org",
        "repo.maven.apache.org",
        "repo1.maven.org",
    ),
    "git-hosts": (
        "github.com",
        "api.github.com",
        "codeload.github.com",
        "*.githubusercontent.com",
        "gitlab.com",
        "bitbucket.org",
    ),
}
MAX_RULES = 200
# A host name's labels (letters, digits, hyphens; punycode for the others), optionally "*." first,
# optionally ":port".
RULE_PATTERN = r"^(\*\.)?([a-z0-9]([a-z0-9-]{0,61}[a-z0-9])?\.)*[a-z0-9]([a-z0-9-]{0,61}[a-z0-9])?(:[0-9]{1,5})?$"
_RULE = re.compile(RULE_PATTERN)
# A target's host: the rules' grammar without "*." and ":port" (a name a rule can name exactly).
HOST_NAME_PATTERN = r"^([a-z0-9]([a-z0-9-]{0,61}[a-z0-9])?\.)*[a-z0-9]([a-z0-9-]{0,61}[a-z0-9])?$"
_HOST_NAME = re.compile(HOST_NAME_PATTERN)
MAX_NAME = 253


class EgressPolicy(BaseModel):
    """What a group's sandbox may reach (see the module's doc)."""

    model_config = ConfigDict(extra="forbid", frozen=True, strict=True)

    mode: EgressMode = "off"
    allow: list[Annotated[str, Field(max_length=260)]] = Field(default_factory=list, max_length=MAX_RULES)
    presets: list[Preset] = Field(default_factory=list)
    methods: list[Method] | None = None
    # The provider's server tools the gateway forwards for the group, held to the allowlist's
    # domains (``search_domains``) and a run's count of such requests.
    server_tools: list[ServerTool] = Field(default_factory=list)
    # The installation's brokered credentials the group gets (ORCHESTRATOR_EGRESS_CREDENTIALS,
    # by name): their hosts are on its list, and its requests to them carry the secret.
    credentials: list[Annotated[str, Field(pattern=r"^[a-z0-9][a-z0-9_-]{0,63}$")]] = Field(default_factory=list)
    max_requests: Annotated[int, Field(ge=1, le=1_000_000), WHOLE_NUMBER] | None = None
    max_bytes: Annotated[int, Field(ge=1, le=1 << 40), WHOLE_NUMBER] | None = None

    @field_validator("allow")
    @classmethod
    def _rules(cls, rules: list[str]) -> list[str]:
        out: list[str] = []
        for i, rule in enumerate(rules):
            rule = rule.strip().lower().rstrip(".")
            if not _RULE.fullmatch(rule) or _is_ip(rule.partition(":")[0]):
                raise ValueError(f"allow[{i}]: {rule!r} is no host name rule (name, *.name, either with :port)")
            port = rule.partition(":")[2]
            if port and not 1 <= int(port) <= 65535:
                raise ValueError(f"allow[{i}]: port {port} is out of range")
            out.append(rule)
        return list(dict.fromkeys(out))


def _is_ip(name: str) -> bool:
    return bool(re.fullmatch(r"[0-9.]+", name))


def host_name(text: str) -> str:
    """``text`` as a request's target host: a name of the rules' grammar (ASCII letters, digits
    and hyphens in dot-separated labels of at most 63, 253 in all), lowercased, one trailing
    dot (the root's) dropped; ValueError saying why not.  Refused: ``*`` (``*.com`` is a rule,
    never a host a request reaches), ``_``, an empty label (``a..b``, ``a.b..``), a port, and a
    name the resolver reads as an IPv4 address (``127.1``, ``0x7f.1``).  The egress proxy holds
    every target to it before it decides or asks, and an Allow the rule it adds."""
    name = text.lower() if text.isascii() else text
    name = name.removesuffix(".")
    if not name or len(name) > MAX_NAME or not _HOST_NAME.fullmatch(name):
        raise ValueError(f"{text!r} is not a host name (letters, digits and hyphens in dot-separated labels)")
    if _is_ip(name) or _reads_as_ipv4(name):
        raise ValueError(f"{text!r} is an IP address, not a host name")
    return name


def port_number(text: str) -> int:
    """``text`` as a port: digits only, 1 to 65535; ValueError otherwise (``+443``, `` 443``,
    ``1:443``, non-ASCII digits, which ``int`` would take, among them)."""
    if not re.fullmatch(r"[0-9]{1,5}", text) or not 1 <= int(text) <= 65535:
        raise ValueError(f"{text!r} is not a port (digits, 1 to 65535)")
    return int(text)


def _reads_as_ipv4(name: str) -> bool:
    # inet_aton's spellings (hex, octal, fewer than four parts): what getaddrinfo takes as an address.
    try:
        socket.inet_aton(name)
    except OSError:
        return False
    return True


def rules_of(policy: EgressPolicy) -> list[str]:
    """The policy's rules with its presets' spelled out."""
    return [*policy.allow, *(rule for preset in policy.presets for rule in PRESETS[preset])]


def search_domains(policy: EgressPolicy) -> tuple[str, ...]:
    """The domains the provider's server tools may reach for the group: the allowlist's names
    without ports, a ``*.name`` rule as its name (the provider takes a domain with the names
    below it)."""
    if policy.mode == "off":
        return ()
    names = (rule.partition(":")[0].removeprefix("*.") for rule in rules_of(policy))
    return tuple(dict.fromkeys(names))


def opened_tools(policy: EgressPolicy) -> frozenset[str]:
    """The server tools' type prefixes the policy opens at the gateway."""
    return frozenset(SERVER_TOOLS[name] for name in policy.server_tools)


def host_refusal(policy: EgressPolicy, host: str, port: int) -> str | None:
    """Why ``host:port`` is not among what ``policy`` allows (None: it is)."""
    if policy.mode == "off":
        return "this group's network policy is off (orchestrator groups set --network)"
    name = host.lower().rstrip(".")
    for rule in rules_of(policy):
        pattern, _, rule_port = rule.partition(":")
        if rule_port and int(rule_port) != port:
            continue
        if pattern.startswith("*."):
            if name.endswith(pattern[1:]) and name != pattern[2:]:
                return None
        elif name == pattern:
            return None
    if policy.mode == "ask":
        return f"{name}:{port} is not on this group's allowlist yet: the chat is asked whether to allow it"
    return f"{name}:{port} is not on this group's allowlist"


def may_ask(policy: EgressPolicy, host: str, port: int) -> bool:
    """Whether a refusal of ``host:port`` is one the chat is asked about (``ask`` mode, off the list)."""
    return policy.mode == "ask" and host_refusal(policy, host, port) is not None


def method_refusal(policy: EgressPolicy, method: str) -> str | None:
    """Why ``method`` is not allowed (None: it is)."""
    if policy.methods is None or method in policy.methods:
        return None
    return f"the method {method} is not among this group's allowed methods ({', '.join(policy.methods)})"


def parse_network_option(text: str) -> EgressPolicy:
    """``off``, or ``allowlist:RULE,RULE,...`` (``preset:NAME`` among the rules) as the command
    line spells a policy; ValueError naming what is wrong."""
    word, _, rest = text.strip().partition(":")
    if word == "off" and not rest:
        return EgressPolicy()
    if word == "ask" and not rest.strip():
        return EgressPolicy(mode="ask")
    if word not in ("allowlist", "ask") or not rest.strip():
        raise ValueError(
            f"--network: {text!r}: use off, allowlist:HOST[,HOST...] or ask[:HOST,...] (preset:NAME for a preset)"
        )
    allow: list[str] = []
    presets: list[str] = []
    server_tools: list[str] = []
    credentials: list[str] = []
    for part in (p.strip() for p in rest.split(",")):
        if part.startswith("preset:"):
            presets.append(part[len("preset:") :])
        elif part.startswith("server-tool:"):
            server_tools.append(part[len("server-tool:") :])
        elif part.startswith("credential:"):
            credentials.append(part[len("credential:") :])
        elif part:
            allow.append(part)
    try:
        return EgressPolicy.model_validate(
            {"mode": word, "allow": allow, "presets": presets, "server_tools": server_tools, "credentials": credentials}
        )
    except ValidationError as exc:
        first = exc.errors()[0]
        where = ".".join(str(p) for p in first["loc"])
        raise ValueError(f"{where}: {str(first['msg']).removeprefix('Value error, ')}") from None
