"""What the API checks before a route sees a request: its Host, its token, its body's size.

An ASGI middleware (:class:`RequestGuard`) around the whole application, so
each check runs on the request's headers alone, before a byte of the body is
read or parsed; a refusal is an :class:`~orchestrator.http.contract.ErrorBody`
like every other error answer:

* **Host** (only while no ``ORCHESTRATOR_API_TOKEN`` is set, which is only on
  loopback): the ``Host`` header must name this machine: a loopback address
  (``127.0.0.1``, ``[::1]``), ``localhost``, or a name of
  ``ORCHESTRATOR_API_ALLOWED_HOSTS``, with any port; else 403.  Without it, a
  web page whose name an attacker points at 127.0.0.1 after it loaded (DNS
  rebinding) would be same-origin with the API in the victim's browser, and
  could post messages to the agent.
* **Cross-site requests** (also only while no token is set): a request that
  changes something (``POST``, ``PUT``, ``PATCH``, ``DELETE``) is refused (403)
  when the browser says another site sent it (``Sec-Fetch-Site: cross-site``
  or ``same-site``), when its ``Origin`` is not this API's own (scheme, name
  and port of its ``Host``), and when it lacks :data:`CLIENT_HEADER`
  (``X-Orchestrator-Client``, any value), which the CLI's client and the web
  page send.  Without a token, any web page the operator visits could
  otherwise post to the API on loopback: an HTML form, or a ``fetch`` with
  a body of no JSON type (older FastAPI versions read it as JSON all the
  same), goes without a CORS preflight; a custom header does not, and the API
  grants none.  The signed routes (the inbound webhook, Slack's events) are
  exempt: they carry their own signatures.
* **Token** (``/api`` and ``/metrics`` while a token is set): checked here, in
  constant time, before the body is read and parsed (FastAPI reads and
  decodes a route's body before its dependencies run: an unauthenticated
  client could make the server parse megabytes of JSON).  The routes'
  dependency (``orchestrator/http/api.py``) checks it again and puts it in the
  OpenAPI document.
* **Size** (every request): a ``Content-Length`` over
  ``ORCHESTRATOR_API_MAX_REQUEST_BYTES`` is a 413 before the body is read; a
  chunked body (no length) is read here up to that size and handed on, or
  refused with 413 at the first byte past it, so no route ever holds more.
  A route that streams its body has a limit of its own (a :class:`BodyLimit`:
  the file upload's, ``orchestrator/http/routes/files.py``, is the per-file
  limit times the files one message may carry, and a little for the parts'
  headers): a ``Content-Length`` over it is a 413 here; a chunked body is
  handed on unread, and the route counts it as it streams (never whole in
  memory, here or there).
"""

from __future__ import annotations

import hmac
import ipaddress
import json
import re
from collections.abc import Awaitable, Callable, MutableMapping
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit

from orchestrator.core.settings import Settings
from orchestrator.http.endpoint import CLIENT_HEADER

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]
ASGIApp = Callable[[Scope, Receive, Send], Awaitable[None]]

# The paths behind the token (the page, its files, /health and the signed webhook are not).
TOKEN_PATHS = ("/api", "/metrics")
HOST_REFUSED = (
    "this API serves this machine only while ORCHESTRATOR_API_TOKEN is unset: the Host header "
    "must be 127.0.0.1, localhost or [::1] (or a name of ORCHESTRATOR_API_ALLOWED_HOSTS)"
)


def host_name(header: str) -> str:
    """The name in a ``Host`` header, without its port or an IPv6 address's brackets."""
    header = header.strip().lower()
    if header.startswith("["):
        return header[1:].partition("]")[0]
    name, colon, port = header.rpartition(":")
    return name if colon and port.isdigit() else header


_LOCAL = frozenset({"localhost", "127.0.0.1", "::1"})  # the usual names, without parsing an address
# The headers the guard reads (the others are not even decoded).
_READ = frozenset(
    {
        b"host",
        b"authorization",
        b"content-length",
        b"transfer-encoding",
        b"origin",
        b"sec-fetch-site",
        CLIENT_HEADER.lower().encode(),
    }
)
# The methods that change nothing; the others, without a token, must come from this API's clients.
SAFE_METHODS = frozenset({"GET", "HEAD", "OPTIONS"})
_DEFAULT_PORTS = {"http": 80, "https": 443}


def is_local_name(name: str, extra: frozenset[str] = frozenset()) -> bool:
    """Whether a Host header's name (see :func:`host_name`) names this machine."""
    if name in _LOCAL or name in extra:
        return True
    try:
        return ipaddress.ip_address(name).is_loopback
    except ValueError:
        return False


def under(path: str, prefixes: tuple[str, ...]) -> bool:
    return any(path == p or path.startswith(p + "/") for p in prefixes)


def host_port(header: str) -> int | None:
    """The port in a ``Host`` header; None when it names none."""
    header = header.strip()
    tail = header.rpartition("]")[2] if header.startswith("[") else header
    _, colon, port = tail.rpartition(":")
    return int(port) if colon and port.isascii() and port.isdigit() else None


def same_origin(origin: str, host: str, scheme: str = "http") -> bool:
    """Whether an ``Origin`` header names the server that a request with ``Host: host`` reached
    by ``scheme``: the same scheme, name and port (``null``, an opaque origin, never does)."""
    try:
        parts = urlsplit(origin.strip().lower())
        port = parts.port or _DEFAULT_PORTS.get(parts.scheme)
    except ValueError:  # a port out of range or not a number
        return False
    if parts.scheme != scheme or not parts.hostname or parts.path or parts.query or parts.username:
        return False
    return parts.hostname == host_name(host) and port == (host_port(host) or _DEFAULT_PORTS.get(scheme))


def cross_site_problem(headers: dict[str, str], scheme: str = "http") -> str | None:
    """Why a request that changes something, on an API without a token, may come from a web
    page of another site (see the module's doc); None when it comes from this API's clients."""
    fetched_from = headers.get("sec-fetch-site", "").strip().lower()
    if fetched_from in ("cross-site", "same-site"):
        return (
            f"refused: a request from another site's page (Sec-Fetch-Site: {fetched_from}); while "
            "ORCHESTRATOR_API_TOKEN is unset only this API's own page and local clients may change anything"
        )
    origin = headers.get("origin")
    if origin is not None and not same_origin(origin, headers.get("host", ""), scheme):
        return (
            f"refused: a request from another origin's page (Origin: {origin[:200]}); while "
            "ORCHESTRATOR_API_TOKEN is unset only this API's own page and local clients may change anything"
        )
    if not headers.get(CLIENT_HEADER.lower(), "").strip():
        return (
            f"missing header {CLIENT_HEADER} (any value): while ORCHESTRATOR_API_TOKEN is unset, a "
            f"{'/'.join(('POST', 'PUT', 'PATCH', 'DELETE'))} needs it (the CLI and the web page send it; "
            "a page of another site cannot)"
        )
    return None


@dataclass(frozen=True)
class BodyLimit:
    """The body limit of a route that streams its body and counts it itself (in place of
    ``ORCHESTRATOR_API_MAX_REQUEST_BYTES``): its method, its path (a whole match), the limit,
    and the limit as the 413 names it."""

    method: str
    path: re.Pattern[str]
    max_bytes: int
    described: str

    def applies(self, scope: Scope) -> bool:
        return scope.get("method") == self.method and self.path.fullmatch(scope.get("path", "")) is not None


class RequestGuard:
    """The ASGI middleware of the module's doc, for the API of ``settings``."""

    def __init__(
        self,
        app: ASGIApp,
        settings: Settings,
        signed_paths: tuple[str, ...] = (),
        streamed: tuple[BodyLimit, ...] = (),
    ) -> None:
        self.app = app
        # Routes that check their own signatures: no cross-site check (their senders are other systems).
        self.signed_paths = signed_paths
        # Routes that stream their bodies, each with its own limit.
        self.streamed = streamed
        self.max_body = settings.api.max_request_bytes
        self.token = settings.api.token.encode()
        # None: no Host check (a token is set).
        self.hosts: frozenset[str] | None = (
            None
            if self.token
            else frozenset(h.strip().lower() for h in settings.api.allowed_hosts.split(",") if h.strip())
        )

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        # ASGI servers give header names in lower case.
        headers = {k.decode("latin-1"): v.decode("latin-1") for k, v in scope.get("headers", ()) if k in _READ}
        if self.hosts is not None and not is_local_name(host_name(headers.get("host", "")), self.hosts):
            await _answer(send, 403, HOST_REFUSED)
            return
        if (
            self.hosts is not None
            and scope.get("method", "GET") not in SAFE_METHODS
            and not under(scope.get("path", ""), self.signed_paths)
        ):
            problem = cross_site_problem(headers, scope.get("scheme", "http"))
            if problem:
                await _answer(send, 403, problem)
                return
        if self.token and under(scope.get("path", ""), TOKEN_PATHS):
            problem = self._token_problem(headers.get("authorization"))
            if problem:
                await _answer(send, 401, problem, {"www-authenticate": "Bearer"})
                return
        length = headers.get("content-length")
        own = next((limit for limit in self.streamed if limit.applies(scope)), None)
        if length is not None:
            if not (length.strip().isascii() and length.strip().isdigit()):  # "²" is a digit to isdigit
                await _answer(send, 400, "Content-Length is not a number", close=True)
                return
            if own is not None:
                if int(length) > own.max_bytes:
                    await _answer(send, 413, _body_over(own.max_bytes, own.described), close=True)
                    return
            elif int(length) > self.max_body:
                await _answer(send, 413, self._too_large(), close=True)
                return
        elif own is not None:
            pass  # streamed: the route counts the body as it reads it
        elif "chunked" in headers.get("transfer-encoding", "").lower():
            body = await self._read_capped(receive)
            if body is None:
                await _answer(send, 413, self._too_large(), close=True)
                return
            receive = _replay(body, receive)
        await self.app(scope, receive, send)

    def _token_problem(self, authorization: str | None) -> str | None:
        scheme, _, credentials = (authorization or "").strip().partition(" ")
        given = credentials.strip().encode() if scheme.lower() == "bearer" else b""
        if hmac.compare_digest(given, self.token):
            return None
        return "missing or wrong bearer token" if given else "this API needs 'Authorization: Bearer <token>'"

    def _too_large(self) -> str:
        return _body_over(self.max_body, "ORCHESTRATOR_API_MAX_REQUEST_BYTES")

    async def _read_capped(self, receive: Receive) -> bytes | None:
        """The whole body of a chunked request, or None at the first byte past the cap."""
        chunks: list[bytes] = []
        size = 0
        while True:
            message = await receive()
            if message["type"] != "http.request":  # the client went away: the app sees an empty body
                break
            chunk = message.get("body", b"")
            size += len(chunk)
            if size > self.max_body:
                return None
            chunks.append(chunk)
            if not message.get("more_body", False):
                break
        return b"".join(chunks)


def _body_over(max_bytes: int, described: str) -> str:
    return f"the request body is larger than {max_bytes} bytes ({described})"


def _replay(body: bytes, receive: Receive) -> Receive:
    """``receive`` for the app: the body read already, then the real one (a disconnect)."""
    sent = False

    async def replay() -> Message:
        nonlocal sent
        if not sent:
            sent = True
            return {"type": "http.request", "body": body, "more_body": False}
        return await receive()

    return replay


async def _answer(
    send: Send, status: int, detail: str, headers: dict[str, str] | None = None, *, close: bool = False
) -> None:
    body = json.dumps({"detail": detail}).encode()
    raw = [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]
    raw += [(k.encode(), v.encode()) for k, v in (headers or {}).items()]
    if close:  # the unread body is still on its way: this connection takes no further request
        raw.append((b"connection", b"close"))
    await send({"type": "http.response.start", "status": status, "headers": raw})
    await send({"type": "http.response.body", "body": body})
