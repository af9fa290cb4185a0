"""What one run's gateway is: the upstream it forwards to, what the run may ask for, and
what the sandbox may make the host spend (:class:`GatewayConfig`).

The pipeline builds it from the settings (:meth:`GatewayConfig.for_provider`, through
``ModelGateway.for_provider``); tests build it by hand.  Frozen: a gateway's config does
not change while it serves, and the rules (``rules.py``) read it from every request's
thread.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Literal

from orchestrator.sandbox.providers import GatewayRoute, facts_of, split_spec

from .upstream import UPSTREAMS, Auth

if TYPE_CHECKING:
    from orchestrator.core.settings import Settings

MAX_REQUEST_BYTES = 32 * 1024 * 1024
MAX_CONNECTIONS = 16
READ_TIMEOUT_S = 30.0
# Requests with a server tool (the provider's web search) one run may make: their fees are not tokens.
MAX_SERVER_TOOL_REQUESTS = 20

ModelPolicy = Literal["refuse", "rewrite"]


@dataclass(frozen=True, slots=True)
class GatewayConfig:
    """One run's gateway.

    ``route`` names the API (``upstream.UPSTREAMS``): the paths it serves and how the key is
    sent, ``x-api-key`` (Anthropic; always sent) or ``Authorization: Bearer`` (left out when
    the key is empty).

    ``model`` and ``max_tokens`` are what the run may ask for (None: anything);
    ``model_policy`` says what happens to a request that asks for more: ``refuse`` (403)
    or ``rewrite`` (sent with the allowed values).  ``token_budget``: input + output tokens
    the run may spend (0: no limit), checked before each request, which must also fit its
    output cap in what is left: a run can overspend only by the input of its last request.
    ``server_tools``: the provider's server tools the group's network policy opens
    (egress_policy.SERVER_TOOLS: type prefixes such as ``web_search_``), held to
    ``search_domains``, in at most ``max_server_tool_requests`` requests a run.

    The bounds on what the sandbox can make the host spend: ``max_request_bytes`` a body,
    ``max_connections`` open at once, ``read_timeout_s`` on every read (idle keep-alive
    included); ``timeout_s`` bounds an upstream request and the wait for the one before it.
    """

    base_url: str
    api_key: str
    route: GatewayRoute = "anthropic"
    timeout_s: float = 600.0
    # What the run may ask for.
    model: str | None = None
    max_tokens: int | None = None
    model_policy: ModelPolicy = "refuse"
    token_budget: int = 0
    server_tools: frozenset[str] = frozenset()
    search_domains: tuple[str, ...] = ()
    max_server_tool_requests: int = MAX_SERVER_TOOL_REQUESTS
    # What the sandbox may make the host spend.
    max_request_bytes: int = MAX_REQUEST_BYTES
    max_connections: int = MAX_CONNECTIONS
    read_timeout_s: float = READ_TIMEOUT_S

    @property
    def paths(self) -> frozenset[str]:
        """The routes forwarded (any other is refused, 403)."""
        return UPSTREAMS[self.route].paths

    @property
    def auth(self) -> Auth:
        return UPSTREAMS[self.route].auth

    @classmethod
    def for_provider(
        cls,
        settings: Settings,
        provider: str,
        *,
        model: str | None = None,
        max_tokens: int | None = None,
        server_tools: frozenset[str] = frozenset(),
        search_domains: tuple[str, ...] = (),
    ) -> GatewayConfig:
        """The gateway for ``provider`` (one whose row in ``sandbox/providers.py`` has a gateway
        route) as ``settings`` configure it.

        ``model`` and ``max_tokens``: what the run may ask for (the pipeline passes its
        recorded input's); by default ``ORCHESTRATOR_MODEL``'s model when it names
        ``provider``, and ``ORCHESTRATOR_MAX_TOKENS``.
        """
        facts = facts_of(provider)
        if facts is None or facts.gateway is None:
            raise ValueError(f"no model gateway for provider {provider!r}")
        upstream = UPSTREAMS[facts.gateway]
        if model is None:
            named, model_id = split_spec(settings.provider.model)
            model = model_id if named == provider and model_id else None
        return cls(
            base_url=upstream.base_url(settings.provider),
            api_key=upstream.api_key(settings.provider),
            route=facts.gateway,
            model=model,
            max_tokens=settings.provider.max_tokens if max_tokens is None else max_tokens,
            model_policy=settings.gateway.model_policy,
            token_budget=settings.provider.run_token_budget,
            server_tools=server_tools,
            search_domains=search_domains,
            max_server_tool_requests=settings.gateway.max_server_tool_requests,
            max_request_bytes=settings.gateway.max_request_bytes,
            max_connections=settings.gateway.max_connections,
            read_timeout_s=settings.gateway.read_timeout_s,
        )
