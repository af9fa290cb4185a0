"""Where the gateway forwards: the model APIs (:data:`UPSTREAMS`), and the client that sends
a request to one with the key added and relays its answer (:class:`UpstreamClient`).

Two upstreams, each the route of a provider's row in ``sandbox/providers.py``:
Anthropic (``POST /v1/messages``, key in ``x-api-key``) and an OpenAI-compatible server
(``POST /v1/chat/completions``, key as ``Authorization: Bearer``, none when no key is
configured, as for a local Ollama).  The key never enters the container: the gateway
sets it on the way out, and an upstream's error that echoes it has it redacted.
"""

from __future__ import annotations

import functools
import json
import ssl
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler
from typing import TYPE_CHECKING, Literal

import httpx

from orchestrator.sandbox.providers import GatewayRoute

from .metering import Account, Meter, SseUsage
from .server import relay_stream, send_answer

if TYPE_CHECKING:
    from orchestrator.core.settings import ProviderSettings

ANTHROPIC_PATHS = frozenset({"/v1/messages"})
OPENAI_PATHS = frozenset({"/v1/chat/completions"})
Auth = Literal["x-api-key", "bearer"]


@dataclass(frozen=True, slots=True)
class Upstream:
    """An API the gateway forwards to: the paths it serves, how its key is sent, and the
    settings that name its server and its key."""

    paths: frozenset[str]
    auth: Auth
    base_url: Callable[[ProviderSettings], str]
    api_key: Callable[[ProviderSettings], str]
    # The setting it cannot be used without, by name (for a refusal's text) and as read: a
    # group's choice of model is refused while it is empty (run/profile.py).  Anthropic's
    # API needs a key; an OpenAI-compatible server often needs none, but an address.
    required: tuple[str, Callable[[ProviderSettings], str]]


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


def missing_setting(provider: ProviderSettings, route: GatewayRoute) -> str | None:
    """The setting ``route``'s upstream needs that ``provider`` leaves empty (None: it is configured)."""
    name, read = UPSTREAMS[route].required
    return None if read(provider).strip() else name


@functools.cache
def tls_context() -> ssl.SSLContext:
    """The upstream client's TLS context, made once per process.

    Loading the CA bundle is most of what a new ``httpx.Client`` costs (tens
    of ms, over 100 on a busy machine): every run opens a gateway, and
    would pay it again (docs/performance.md, "The model gateway").  httpx
    makes the same one (``SSL_CERT_FILE``/``SSL_CERT_DIR`` honoured).
    """
    return httpx.create_ssl_context()


class UpstreamClient:
    """One gateway's way to its upstream at ``base_url``: the key added as ``auth`` says, the
    answer relayed to the sandbox and charged to the run's :class:`Account`."""

    def __init__(self, base_url: str, api_key: str, auth: Auth, timeout_s: float) -> None:
        self.base_url = base_url.rstrip("/")
        self._api_key = api_key
        self._auth = auth
        self._client = httpx.Client(timeout=timeout_s, verify=tls_context())

    def close(self) -> None:
        self._client.close()

    def forward(
        self, h: BaseHTTPRequestHandler, path: str, headers: dict[str, str], body: bytes, account: Account
    ) -> None:
        """Send ``body`` to ``path`` upstream and answer ``h`` with what comes back; a 200 is charged."""
        if self._auth == "bearer":
            if self._api_key:
                headers["authorization"] = f"Bearer {self._api_key}"
        else:
            headers["x-api-key"] = self._api_key
        meter = Meter()
        charged = False

        def charge() -> None:
            # Once per answer, before its last byte goes out: a client that
            # has read the answer sees it counted.
            nonlocal charged
            if not charged:
                charged = True
                account.charge(meter, len(body))

        account.count_request()
        status = 502
        try:
            with self._client.stream("POST", self.base_url + path, content=body, headers=headers) as resp:
                status = resp.status_code
                ctype = resp.headers.get("content-type", "application/json")
                if status == 200 and ctype.startswith("text/event-stream"):
                    relay_stream(h, ctype, resp.iter_bytes(), SseUsage(meter).feed, charge)
                else:
                    content = resp.read()
                    if status == 200:
                        meter.read_answer(content)
                        charge()
                    if self._api_key and self._api_key.encode() in content:
                        # An upstream's error may echo the key it was sent ("Incorrect API key
                        # provided: sk-..."): the key never enters the container, not even so.
                        content = content.replace(self._api_key.encode(), b"[redacted]")
                    send_answer(h, status, ctype, content, resp.headers.get("retry-after"))
        except httpx.HTTPError as exc:
            if status == 200:  # cut mid-answer: the headers are sent, the client sees the end
                h.close_connection = True
            else:
                message = f"gateway: upstream unreachable: {exc}"
                content = json.dumps({"type": "error", "error": {"type": "api_error", "message": message}}).encode()
                send_answer(h, 502, "application/json", content, None)
        finally:
            if status == 200:
                charge()
