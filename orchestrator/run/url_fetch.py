"""URL context blocks fetched by the host: no window for DNS rebinding, and deadlines.

A chat message names the URL, so the host must not become a way into its
own network.  Each hop (the URL, then each redirect) is resolved **once**;
every address of the answer must be public (unless
``ORCHESTRATOR_CONTEXT_URL_ALLOW_PRIVATE``; an IPv6 address that carries an
IPv4 one, NAT64, 6to4, Teredo and the like, is judged by that IPv4 address),
and the connection goes to the first of those very addresses that answers
(:class:`_PinnedBackend`), while the URL keeps its name for the ``Host``
header, TLS's SNI and the certificate check.  A resolver that answers a
public address to the check and ``127.0.0.1`` to the connection (rebinding)
gets its second answer never asked for: the connection asks no resolver.

The per-read timeout (``ORCHESTRATOR_CONTEXT_URL_TIMEOUT_S``) bounds each
wait, not the fetch: a server trickling a byte at a time would hold a run's
assembly for ever.  So every wait (resolving, connecting, TLS, each read) is
also bounded by what is left of two deadlines, the fetch's
(``ORCHESTRATOR_CONTEXT_URL_FETCH_DEADLINE_S``) and the run's, shared by all
the URL blocks of one run's input (``ORCHESTRATOR_CONTEXT_URL_RUN_DEADLINE_S``,
:class:`UrlBudget`); past either, the fetch stops and the block is an error.  A URL
met once the run's deadline is gone is not fetched at all: no resolver thread,
no DNS question, no connection.

Whatever the page is, it becomes text or an error block, never an exception:
history is expanded again for every run, so a page the HTML parser or a
charset's codec chokes on would otherwise fail every later run of the group.
"""

from __future__ import annotations

import codecs
import functools
import ipaddress
import socket
import ssl
import threading
import time
from collections.abc import Callable, Iterable, Sequence
from html.parser import HTMLParser
from typing import Any
from urllib.parse import urljoin

import httpcore
import httpx

from orchestrator.core.addresses import embedded_ipv4 as embedded_ipv4
from orchestrator.core.addresses import is_public as is_public
from orchestrator.core.settings import ContextSettings

MAX_REDIRECTS = 3
# An address -> may the host fetch from it.  The default: public addresses only (tests put a
# loopback address of their own on the public side of the line, to attack the rest).
AddressPolicy = Callable[[ipaddress.IPv4Address | ipaddress.IPv6Address], bool]
# (name, port) -> the addresses it resolves to, as text.
Resolver = Callable[[str, int], Sequence[str]]


class ContextUnavailable(Exception):
    """One item could not be read; becomes an error block, never a failed run."""


def system_resolver(host: str, port: int) -> list[str]:
    return [str(info[4][0]) for info in socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)]


class Deadline:
    """A point in time a fetch must not pass; ``left()`` raises once it has."""

    def __init__(self, seconds: float, what: str, setting: str) -> None:
        self.seconds, self.what, self.setting = seconds, what, setting
        self.at = time.monotonic() + seconds

    def left(self) -> float:
        remaining = self.at - time.monotonic()
        if remaining <= 0:
            raise ContextUnavailable(f"{self.what} ({self.setting}) took longer than {self.seconds:g} s")
        return remaining

    def before_starting(self) -> None:
        """Raises once the deadline has passed, saying nothing was started: checked before a fetch
        begins, so no work (a resolver thread, a DNS question, a connection) is begun that could
        not finish in time."""
        if self.at - time.monotonic() <= 0:
            raise ContextUnavailable(
                f"not fetched: the deadline for {self.what} had passed ({self.setting}, {self.seconds:g} s)"
            )


class UrlBudget:
    """The deadline all the URL blocks of one run's input share (made when its assembly starts)."""

    def __init__(self, context: ContextSettings) -> None:
        self.deadline = Deadline(
            context.url_run_deadline_s, "fetching this run's URLs", "ORCHESTRATOR_CONTEXT_URL_RUN_DEADLINE_S"
        )


def _bound(deadlines: Iterable[Deadline], timeout: float | None) -> float:
    """``timeout`` cut to what is left of every deadline (raising once one has passed)."""
    return min([timeout if timeout is not None else float("inf"), *(d.left() for d in deadlines)])


class _PinnedStream(httpcore.NetworkStream):
    """A connection whose every wait is bounded by the deadlines."""

    def __init__(self, inner: httpcore.NetworkStream, deadlines: list[Deadline]) -> None:
        self._inner, self._deadlines = inner, deadlines

    def read(self, max_bytes: int, timeout: float | None = None) -> bytes:
        return self._inner.read(max_bytes, _bound(self._deadlines, timeout))

    def write(self, buffer: bytes, timeout: float | None = None) -> None:
        self._inner.write(buffer, _bound(self._deadlines, timeout))

    def close(self) -> None:
        self._inner.close()

    def start_tls(
        self, ssl_context: ssl.SSLContext, server_hostname: str | None = None, timeout: float | None = None
    ) -> httpcore.NetworkStream:
        inner = self._inner.start_tls(ssl_context, server_hostname, _bound(self._deadlines, timeout))
        return _PinnedStream(inner, self._deadlines)

    def get_extra_info(self, info: str) -> Any:
        return self._inner.get_extra_info(info)


class _PinnedBackend(httpcore.NetworkBackend):
    """Connects to the checked addresses (the first that answers), whatever name the URL gives
    (that name still goes into the Host header and TLS): no second resolution, so no second answer."""

    def __init__(self, addresses: Sequence[str], deadlines: list[Deadline]) -> None:
        self._addresses, self._deadlines = addresses, deadlines
        self._system = httpcore.SyncBackend()

    def connect_tcp(
        self,
        host: str,
        port: int,
        timeout: float | None = None,
        local_address: str | None = None,
        socket_options: Iterable[Any] | None = None,
    ) -> httpcore.NetworkStream:
        failure: Exception | None = None
        for address in self._addresses:
            try:
                stream = self._system.connect_tcp(
                    address.partition("%")[0], port, _bound(self._deadlines, timeout), local_address, socket_options
                )
            except httpcore.ConnectError as exc:
                failure = exc
                continue
            return _PinnedStream(stream, self._deadlines)
        raise failure or httpcore.ConnectError("no address to connect to")

    def connect_unix_socket(
        self, path: str, timeout: float | None = None, socket_options: Iterable[Any] | None = None
    ) -> httpcore.NetworkStream:
        raise ContextUnavailable("no unix sockets")

    def sleep(self, seconds: float) -> None:
        time.sleep(seconds)


@functools.cache
def _tls() -> ssl.SSLContext:
    # httpx's default verification (certifi's roots), made once per process: making one costs milliseconds.
    return httpx.create_ssl_context()


def _resolve(host: str, port: int, resolver: Resolver, deadlines: list[Deadline]) -> list[str]:
    """``resolver``'s answer within the deadlines (getaddrinfo has no timeout of its own: it runs in
    a thread left to finish on its own if it takes longer)."""
    answer: list[str] = []
    failure: list[BaseException] = []

    def ask() -> None:
        try:
            answer.extend(resolver(host, port))
        except Exception as exc:  # noqa: BLE001 - handed to the caller's thread
            failure.append(exc)

    # Measured before the thread starts: once a deadline has passed, no thread is left running
    # (each one lives as long as its getaddrinfo) and no question is asked.
    wait = _bound(deadlines, None)
    thread = threading.Thread(target=ask, name="url-resolve", daemon=True)
    thread.start()
    thread.join(None if wait == float("inf") else wait)
    if thread.is_alive():
        _bound(deadlines, None)  # raises: the deadline passed while waiting
        raise ContextUnavailable(f"resolving {host} took too long")
    if failure:
        raise ContextUnavailable(f"cannot resolve {host}: {failure[0]}")
    if not answer:
        raise ContextUnavailable(f"{host} resolves to no address")
    return answer


def checked_addresses(
    host: str,
    port: int,
    context: ContextSettings,
    *,
    resolver: Resolver = system_resolver,
    allowed: AddressPolicy = is_public,
    deadlines: list[Deadline] | None = None,
) -> list[str]:
    """The addresses to connect to for ``host``: resolved once, every one of them allowed."""
    addresses = _resolve(host, port, resolver, deadlines or [])
    for text in addresses:
        try:
            address = ipaddress.ip_address(text.partition("%")[0])  # an IPv6 scope (%eth0) is no part of it
        except ValueError:
            raise ContextUnavailable(f"{host} resolves to {text!r}, not an address") from None
        if not context.url_allow_private and not allowed(address):
            raise ContextUnavailable(f"{host} resolves to a non-public address; refused")
    return list(dict.fromkeys(addresses))


def fetch_url(
    url: str,
    context: ContextSettings,
    *,
    budget: UrlBudget | None = None,
    resolver: Resolver = system_resolver,
    allowed: AddressPolicy = is_public,
    tls: ssl.SSLContext | None = None,
) -> str:
    """GET ``url`` as text, following a few redirects, each hop resolved once, checked and
    connected to at the checked address; within the fetch's and the run's deadlines.
    ``resolver``, ``allowed`` and ``tls`` (the roots certificates are checked against) are
    the system's unless a test hands in its own."""
    if budget is not None:
        budget.deadline.before_starting()
    deadlines = [
        Deadline(context.url_fetch_deadline_s, "fetching the URL", "ORCHESTRATOR_CONTEXT_URL_FETCH_DEADLINE_S")
    ]
    if budget is not None:
        deadlines.append(budget.deadline)
    try:
        for _ in range(MAX_REDIRECTS + 1):
            target = _parse(url)
            addresses = checked_addresses(
                target.host,
                target.port or (443 if target.scheme == "https" else 80),
                context,
                resolver=resolver,
                allowed=allowed,
                deadlines=deadlines,
            )
            location, text = _get(target, addresses, context, deadlines, tls or _tls())
            if location is None:
                return text
            try:
                url = urljoin(url, location)
            except ValueError as exc:  # the server's Location: "http://[::1", say
                raise ContextUnavailable(f"redirected to no URL: {exc}") from None
    except httpcore.TimeoutException:
        for deadline in deadlines:
            deadline.left()  # says which deadline, if one passed
        raise ContextUnavailable(f"no answer within {context.url_timeout_s:g} s") from None
    except (httpcore.NetworkError, httpcore.ProtocolError, httpcore.UnsupportedProtocol, ssl.SSLError, OSError) as exc:
        raise ContextUnavailable(f"{type(exc).__name__}: {exc}") from None
    raise ContextUnavailable("too many redirects")


def _parse(url: str) -> httpx.URL:
    try:
        target = httpx.URL(url)
        host = target.host  # decoded from IDNA here, so its errors are met here
    except (httpx.InvalidURL, ValueError) as exc:  # ValueError: idna's own (http://xn--/), a bad IPv6 literal
        raise ContextUnavailable(f"not a URL: {exc}") from None
    if target.scheme not in ("http", "https"):
        raise ContextUnavailable("redirected away from http(s)")
    if not host:
        raise ContextUnavailable("no host in the URL")
    return target


def _get(
    target: httpx.URL, addresses: list[str], context: ContextSettings, deadlines: list[Deadline], tls: ssl.SSLContext
) -> tuple[str | None, str]:
    """One GET of ``target`` at ``addresses``: (the redirect's location, "") or (None, the text)."""
    limit = context.url_max_bytes
    timeout = context.url_timeout_s
    netloc = target.netloc.decode("ascii")
    headers = [
        (b"Host", netloc.encode()),
        (b"Accept", b"text/*, application/json"),
        (b"Accept-Encoding", b"identity"),
        (b"User-Agent", b"agent-orchestrator (context block)"),
    ]
    request_url = httpcore.URL(scheme=target.raw_scheme, host=target.raw_host, port=target.port, target=target.raw_path)
    with (
        httpcore.ConnectionPool(
            ssl_context=tls, max_connections=1, retries=0, network_backend=_PinnedBackend(addresses, deadlines)
        ) as pool,
        pool.stream(
            "GET",
            request_url,
            headers=headers,
            extensions={"timeout": {"connect": timeout, "read": timeout, "write": timeout, "pool": timeout}},
        ) as resp,
    ):
        fields = {k.decode("latin-1").lower(): v.decode("latin-1") for k, v in resp.headers}
        if resp.status in (301, 302, 303, 307, 308) and "location" in fields:
            return fields["location"], ""
        if resp.status >= 400:
            raise ContextUnavailable(f"HTTP {resp.status}")
        kind, _, params = fields.get("content-type", "text/plain").partition(";")
        kind = kind.strip().lower()
        if not (kind.startswith("text/") or kind.endswith(("json", "xml"))):
            raise ContextUnavailable(f"not a text document ({kind})")
        data = bytearray()
        for chunk in resp.iter_stream():
            data += chunk
            if len(data) > limit:
                break
    text = _as_text(bytes(data[:limit]), kind, params)
    if len(data) > limit:
        text += f"\n[... truncated at {limit} bytes]"
    return None, text


def _as_text(data: bytes, kind: str, params: str) -> str:
    """The page as text (an HTML page's visible text), or :class:`ContextUnavailable`.

    The page and its charset are the server's: a charset naming a codec that is no text encoding
    (rot13: LookupError) or refuses "replace" (idna: UnicodeError), markup html.parser stops at
    (``<![ ]>``: AssertionError on 3.11).  Any exception here is the page's doing, so any one
    becomes this item's error block, never the run's failure."""
    try:
        text = data.decode(_charset(params), errors="replace")
        if kind == "text/html":
            parser = _TextOnly()
            parser.feed(text)
            text = "\n".join(parser.parts)
    except Exception as exc:  # noqa: BLE001 - whatever the page makes the parser or codec raise
        raise ContextUnavailable(f"cannot turn the page into text ({type(exc).__name__}: {str(exc)[:200]})") from None
    return text


def _charset(params: str) -> str:
    for param in params.split(";"):
        name, _, value = param.partition("=")
        if name.strip().lower() == "charset":
            charset = value.strip().strip('"')
            try:
                return codecs.lookup(charset).name if charset else "utf-8"
            except LookupError:
                return "utf-8"
    return "utf-8"


class _TextOnly(HTMLParser):
    """Visible text of an HTML page (scripts and styles dropped)."""

    def __init__(self) -> None:
        super().__init__()
        self.parts: list[str] = []
        self._skip = 0

    def handle_starttag(self, tag: str, attrs: Any) -> None:
        if tag in ("script", "style", "noscript"):
            self._skip += 1

    def handle_endtag(self, tag: str) -> None:
        if tag in ("script", "style", "noscript") and self._skip:
            self._skip -= 1

    def handle_data(self, data: str) -> None:
        if not self._skip and data.strip():
            self.parts.append(data.strip())
