"""The egress proxy: the sandbox's one way to the network, on its group's terms.

A run whose group's network policy is not ``off`` (``sandbox/egress_policy.py``) gets a
proxy of its own, started and stopped with its attempt beside the model gateway, in the
worker: the policy, the budgets and the log are the run's, the proxy lives exactly as long
as the run may use it, and nothing needs deploying.  It listens on a unix socket in the
run's host-only folder, mounted read-only into the container (as the gateway's is); the
runner relays ``HTTP_PROXY``/``HTTPS_PROXY`` on the container's loopback to it
(``container/agent_runner/egress.py``), so ordinary clients (curl, pip, git, urllib) work.

It is a small asyncio proxy, not a library: without TLS interception a proxy only reads a
request's head, decides and then copies bytes; `h11` parses the head strictly (two
``Content-Length``s, or ``Transfer-Encoding`` beside one, are refused: no smuggling past it).
Per request it decides, and records the decision (:class:`Decision`):

* ``CONNECT host:port`` (HTTPS, or any TLS): the target as the CONNECT line names it, never a
  later SNI or Host; tunnelled once allowed.  A target (a URL's host too) must be a host name
  of the policy's grammar and a port (``egress_policy.host_name``, ``port_number``) before
  anything is decided or asked: ``*.com:443``, ``under_score.example:443`` or
  ``x.test:1:443`` is a 400, never a question;
* a brokered host's CONNECT is intercepted: its one request's path is normalised once
  (``sandbox/request_paths.py``), held to the credential's scope, and sent on as normalised;
* a plain HTTP request in absolute form (``GET http://host:port/path``): forwarded in origin
  form with ``Host`` set from the URL and ``Connection: close``; upgrades are refused;
* the host must be a name (an IP literal is refused) the policy allows, by a method it allows;
  the proxy resolves it itself, through ``ORCHESTRATOR_EGRESS_RESOLVE`` (``host:port:address``,
  exactly that host and port) or the system's resolver, whose every address must be public
  (``core/addresses.py``), and connects to the address it checked (no second lookup to rebind);
  whichever way a name resolves to this host's own addresses (loopback, 0.0.0.0, an
  interface's, its public one), the installation's own ports (``Settings.own_ports``) stay shut;
* a run's requests, bytes (both ways), open connections and idle time are bounded.

A refusal is ``403`` with ``X-Orchestrator-Egress: refused`` and the reason as the body.
"""

from __future__ import annotations

import asyncio
import contextlib
import ipaddress
import logging
import os
import socket
import ssl
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from urllib.parse import urlsplit

import h11

from orchestrator.core.addresses import is_public, is_this_host
from orchestrator.core.errors import GatewayError
from orchestrator.core.settings import Settings
from orchestrator.sandbox.egress_ca import InstallationCA, certificates_of, credential_hosts, ensure_ca
from orchestrator.sandbox.egress_credentials import BrokeredCredential, brokered_hosts, parse_credentials
from orchestrator.sandbox.egress_policy import (
    EgressPolicy,
    host_name,
    host_refusal,
    may_ask,
    method_refusal,
    port_number,
)
from orchestrator.sandbox.gateway import chmod_socket
from orchestrator.sandbox.request_paths import OriginTarget, PathRefused, origin_target

log = logging.getLogger(__name__)

EGRESS_SOCKET = "egress.sock"
# The CA bundle a sandbox with brokered hosts trusts (the system's CAs and the installation's).
EGRESS_CA_BUNDLE = "egress-ca.pem"
REFUSED_HEADER = "X-Orchestrator-Egress"
MAX_HEAD_BYTES = 32 * 1024
CHUNK = 64 * 1024
# A unix socket's path (sun_path) holds at most this many bytes on Linux.
_MAX_UNIX_PATH = 107
_HOP_BY_HOP = frozenset(
    {
        b"connection",
        b"keep-alive",
        b"proxy-connection",
        b"proxy-authorization",
        b"proxy-authenticate",
        b"te",
        b"trailer",
        b"upgrade",
        b"host",
    }
)

Resolver = Callable[[str, int], Sequence[str]]


def system_resolver(host: str, port: int) -> list[str]:
    return [str(info[4][0]) for info in socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)]


@dataclass(frozen=True)
class Limits:
    """A run's egress bounds (the settings', narrowed by the group's policy)."""

    max_requests: int = 1000
    max_bytes: int = 256 * 1024 * 1024
    max_connections: int = 64
    idle_s: float = 60.0
    connect_s: float = 10.0
    resolve_s: float = 5.0


@dataclass
class Decision:
    """One request's fate, as the run's egress log keeps it."""

    at: float
    method: str
    host: str
    port: int
    allowed: bool
    reason: str
    sent: int = 0
    received: int = 0
    # An intercepted request's path, without its query string (a tunnel's is not seen).
    path: str | None = None


@dataclass
class _Run:
    requests: int = 0
    bytes: int = 0
    connections: int = 0
    decisions: list[Decision] = field(default_factory=list)
    left_out: int = 0
    # The hosts refused in ``ask`` mode, in the order first asked: the chat is asked about them.
    to_ask: dict[tuple[str, int], None] = field(default_factory=dict)


class _Refused(Exception):
    def __init__(self, reason: str, status: int = 403) -> None:
        super().__init__(reason)
        self.reason = reason
        self.status = status


def parse_resolve(entries: Sequence[str]) -> dict[tuple[str, int], str]:
    """``host:port:address`` entries (as ``ORCHESTRATOR_EGRESS_RESOLVE`` and curl's ``--resolve``
    spell them) as a map; ValueError naming a bad one."""
    out: dict[tuple[str, int], str] = {}
    for entry in entries:
        host, _, rest = entry.strip().partition(":")
        port_text, _, address = rest.partition(":")
        try:
            port = int(port_text)
            ipaddress.ip_address(address.strip("[]"))
        except ValueError:
            raise ValueError(f"{entry!r}: expected host:port:address") from None
        if not host or not 1 <= port <= 65535:
            raise ValueError(f"{entry!r}: expected host:port:address")
        out[(host.lower().rstrip("."), port)] = address.strip("[]")
    return out


class EgressProxy:
    """The run's proxy on ``socket_path`` (a host-only folder's), deciding by ``policy``."""

    def __init__(
        self,
        socket_path: Path,
        policy: EgressPolicy,
        *,
        limits: Limits | None = None,
        resolve: dict[tuple[str, int], str] | None = None,
        forbidden_ports: frozenset[int] = frozenset(),
        resolver: Resolver = system_resolver,
        allowed: Callable[[ipaddress.IPv4Address | ipaddress.IPv6Address], bool] = is_public,
        max_log: int = 500,
        brokered: dict[str, BrokeredCredential] | None = None,
        ca: InstallationCA | None = None,
        upstream_tls: ssl.SSLContext | None = None,
        sandbox_trust: bytes = b"",
    ) -> None:
        self.socket_path = socket_path
        self.policy = policy
        base = limits or Limits()
        self.limits = Limits(
            max_requests=min(base.max_requests, policy.max_requests or base.max_requests),
            max_bytes=min(base.max_bytes, policy.max_bytes or base.max_bytes),
            max_connections=base.max_connections,
            idle_s=base.idle_s,
            connect_s=base.connect_s,
            resolve_s=base.resolve_s,
        )
        self.resolve = resolve or {}
        self.forbidden_ports = forbidden_ports
        self.resolver = resolver
        # Which resolved addresses may be reached (every one a name resolves to must be).
        self.allowed = allowed
        self.max_log = max_log
        # Hosts whose requests carry a brokered credential: TLS to them is ended here, with a
        # leaf certificate of ``ca`` (minted once per host and run), and made anew upstream.
        self.brokered = brokered or {}
        self.ca = ca
        self.upstream_tls = upstream_tls or ssl.create_default_context()
        # Certificates (PEM) the sandbox trusts besides the system's and ``ca``'s, for TLS it
        # makes itself through a tunnel (the run's bundle: run/attempt.py).
        self.sandbox_trust = sandbox_trust
        self._leaves: dict[str, ssl.SSLContext] = {}
        self.run = _Run()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._server: asyncio.AbstractServer | None = None
        self._thread: threading.Thread | None = None
        self._started = threading.Event()
        self._failed: BaseException | None = None
        self._tasks: set[asyncio.Task[None]] = set()

    # -- life -----------------------------------------------------------------------------

    def __enter__(self) -> EgressProxy:
        self._thread = threading.Thread(target=self._serve, name="egress-proxy", daemon=True)
        self._thread.start()
        self._started.wait()
        if self._failed is not None:
            raise GatewayError(f"cannot start the egress proxy on {self.socket_path}: {self._failed}")
        return self

    def __exit__(self, *exc: object) -> None:
        loop = self._loop
        if loop is not None and not loop.is_closed():
            loop.call_soon_threadsafe(self._stop)
        if self._thread is not None:
            self._thread.join(timeout=5)
        self._unlink()

    @property
    def decisions(self) -> list[Decision]:
        return list(self.run.decisions)

    def _serve(self) -> None:
        loop = asyncio.new_event_loop()
        self._loop = loop
        try:
            listener = self._bind()
            self._server = loop.run_until_complete(asyncio.start_unix_server(self._handle, sock=listener))
        except BaseException as exc:  # noqa: BLE001 - told to the starting thread
            self._failed = exc
            self._started.set()
            loop.close()
            return
        self._started.set()
        try:
            loop.run_forever()
        finally:
            loop.run_until_complete(loop.shutdown_asyncgens())
            loop.close()

    def _stop(self) -> None:
        assert self._loop is not None
        if self._server is not None:
            self._server.close()
        for task in list(self._tasks):
            task.cancel()

        async def drain() -> None:
            if self._tasks:
                await asyncio.wait(list(self._tasks), timeout=2)
            asyncio.get_running_loop().stop()

        self._loop.create_task(drain())

    def _bind(self) -> socket.socket:
        # As the gateway binds: through a descriptor of the host-only folder, no symlink followed.
        folder, name = os.fsencode(self.socket_path.parent), os.fsencode(self.socket_path.name)
        dir_fd = os.open(folder, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
        try:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(name, dir_fd=dir_fd)
            bind_to = (
                f"/proc/self/fd/{dir_fd}/".encode() + name
                if os.path.isdir("/proc/self/fd")
                else os.fsencode(self.socket_path)
            )
            if len(bind_to) > _MAX_UNIX_PATH:
                raise GatewayError(f"the egress socket's path is too long: {self.socket_path}")
            listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            listener.bind(bind_to)
            listener.listen(128)
            listener.setblocking(False)
            chmod_socket(dir_fd, name, 0o666)
            return listener
        finally:
            os.close(dir_fd)

    def _unlink(self) -> None:
        with contextlib.suppress(OSError):
            if self.socket_path.is_socket():
                self.socket_path.unlink()

    # -- one connection -----------------------------------------------------------------------

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        assert task is not None
        run = self.run
        if run.connections >= self.limits.max_connections:
            writer.close()
            return
        self._tasks.add(task)
        run.connections += 1
        try:
            await self._one_request(reader, writer)
        except (TimeoutError, asyncio.CancelledError, ConnectionError, OSError):
            pass
        finally:
            run.connections -= 1
            self._tasks.discard(task)
            with contextlib.suppress(Exception):
                writer.close()

    async def _one_request(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        conn = h11.Connection(h11.SERVER, max_incomplete_event_size=MAX_HEAD_BYTES)
        try:
            request = await self._read_head(conn, reader)
        except _Refused as refused:
            await self._refuse(writer, refused, None)
            return
        if request is None:
            return
        method = request.method.decode("ascii", "replace").upper()
        target = request.target.decode("ascii", "replace")
        decision = Decision(time.time(), method, "", 0, False, "")
        try:
            if method == "CONNECT":
                host, port = _authority(target, default_port=None)
            else:
                host, port, path = _absolute(target)
            decision.host, decision.port = host, port
            address = await self._decide(method, host, port, request)
        except _Refused as refused:
            decision.reason = refused.reason
            self._record(decision)
            await self._refuse(writer, refused, conn)
            return
        decision.allowed, decision.reason = True, "allowed"
        credential = self.brokered.get(host) if method == "CONNECT" else None
        if credential is not None and self.ca is not None:
            decision.reason = f"intercepted for the credential {credential.name!r}"
            self._record(decision)
            await self._intercept(reader, writer, conn, host, port, address, credential)
            return
        self._record(decision)
        try:
            upstream_r, upstream_w = await asyncio.wait_for(
                asyncio.open_connection(address, port), timeout=self.limits.connect_s
            )
        except (TimeoutError, OSError) as exc:
            decision.reason = f"allowed; the connection failed: {exc or 'timed out'}"
            await self._refuse(writer, _Refused(f"cannot connect to {host}:{port}", status=502), conn)
            return
        try:
            if method == "CONNECT":
                writer.write(b"HTTP/1.1 200 Connection established\r\n\r\n")
                await writer.drain()
                early = conn.trailing_data[0]
                if early:
                    decision.sent += self._charge(len(early))
                    upstream_w.write(early)
            else:
                await self._forward_request(conn, reader, request, host, port, path, upstream_w, decision)
            await self._splice(reader, writer, upstream_r, upstream_w, decision, client_done=method != "CONNECT")
        finally:
            with contextlib.suppress(Exception):
                upstream_w.close()

    async def _intercept(
        self,
        reader: asyncio.StreamReader,
        writer: asyncio.StreamWriter,
        conn: h11.Connection,
        host: str,
        port: int,
        address: str,
        credential: BrokeredCredential,
    ) -> None:
        """A CONNECT to a brokered host: TLS ended here, one request read, checked against the
        credential's methods and paths, sent upstream over TLS with the credential's header (the
        sandbox's own of that name dropped), and its answer relayed; then the connection ends."""
        assert self.ca is not None
        if conn.trailing_data[0]:
            # Bytes before our 200: no TLS client sends them; nothing to end TLS on.
            await self._refuse(writer, _Refused("bytes sent before the tunnel was open", status=400), conn)
            return
        writer.write(b"HTTP/1.1 200 Connection established\r\n\r\n")
        await writer.drain()
        if host not in self._leaves:
            self._leaves[host] = self.ca.server_context(host)
        await asyncio.wait_for(writer.start_tls(self._leaves[host]), timeout=self.limits.idle_s)
        inner = h11.Connection(h11.SERVER, max_incomplete_event_size=MAX_HEAD_BYTES)
        try:
            request = await self._read_head(inner, reader)
        except _Refused as refused:
            await self._answer_inner(writer, inner, refused.status, refused.reason)
            return
        if request is None:
            return
        method = request.method.decode("ascii", "replace").upper()
        sent = request.target.decode("ascii", "replace")
        # Normalised once, before the credential's scope is checked; what was checked is what
        # goes upstream (request_paths.py: no spelling the server resolves out of the scope).
        target: OriginTarget | None = None
        try:
            target = origin_target(sent) if sent.startswith("/") else None
            refusal = None if target is not None else "an intercepted request names a path"
        except PathRefused as exc:
            refusal = str(exc)
        path = target.path if target is not None else sent.split("?", 1)[0]
        decision = Decision(time.time(), method, host, port, False, "", path=path)
        refusal = refusal or method_refusal(self.policy, method) or credential.refusal(method, path)
        if refusal is not None or self.run.requests >= self.limits.max_requests:
            decision.reason = refusal or f"this run's {self.limits.max_requests} requests are spent"
            self._record(decision)
            await self._answer_inner(writer, inner, 403, decision.reason)
            return
        assert target is not None  # no refusal: the target was normalised
        self.run.requests += 1
        decision.allowed, decision.reason = True, f"credential {credential.name!r} added"
        self._record(decision)
        upstream_r, upstream_w = await asyncio.wait_for(
            asyncio.open_connection(address, port, ssl=self.upstream_tls, server_hostname=host),
            timeout=self.limits.connect_s,
        )
        try:
            header = credential.header.lower().encode("ascii")
            await self._forward_request(
                inner,
                reader,
                request,
                host,
                port,
                target.target,
                upstream_w,
                decision,
                default_port=443,
                drop=frozenset({header}),
                extra=[(header, credential.value.encode("latin-1"))],
            )
            await self._relay_response(upstream_r, writer, inner, decision, request.method)
        finally:
            with contextlib.suppress(Exception):
                upstream_w.close()

    async def _relay_response(
        self,
        upstream: asyncio.StreamReader,
        writer: asyncio.StreamWriter,
        inner: h11.Connection,
        decision: Decision,
        method: bytes,
    ) -> None:
        """The upstream's answer, read with h11 and written to the sandbox with ``Connection: close``."""
        client = h11.Connection(h11.CLIENT)
        # The request went out through another h11 connection: this one only reads the answer,
        # framed as an answer to that method (a HEAD's has no body whatever it declares).
        client.send(h11.Request(method=method, target=b"/", headers=[(b"host", b"x")]))
        client.send(h11.EndOfMessage())
        while True:
            event = client.next_event()
            if event is h11.NEED_DATA:
                data = await asyncio.wait_for(upstream.read(CHUNK), timeout=self.limits.idle_s)
                client.receive_data(data)
                continue
            if isinstance(event, h11.InformationalResponse):
                continue
            if isinstance(event, h11.Response):
                headers = [(n, v) for n, v in event.headers if n.lower() not in _HOP_BY_HOP]
                out = inner.send(
                    h11.Response(status_code=event.status_code, headers=[*headers, (b"connection", b"close")])
                )
            elif isinstance(event, h11.Data):
                n = self._charge(len(event.data))
                decision.received += n
                if n < len(event.data):
                    raise ConnectionError("the run's egress bytes are spent")
                out = inner.send(h11.Data(data=event.data))
            elif isinstance(event, h11.EndOfMessage):
                out = inner.send(h11.EndOfMessage())
                if out:
                    writer.write(out)
                await writer.drain()
                return
            else:
                raise ConnectionError(f"unexpected {type(event).__name__} in an answer")
            if out:
                writer.write(out)
                await writer.drain()

    async def _answer_inner(
        self, writer: asyncio.StreamWriter, inner: h11.Connection, status: int, reason: str
    ) -> None:
        """A refusal inside the ended TLS: what the sandbox's client reads as the host's answer."""
        body = f"egress refused: {reason}\n".encode()
        with contextlib.suppress(h11.LocalProtocolError, ConnectionError, OSError):
            writer.write(
                inner.send(
                    h11.Response(
                        status_code=status,
                        headers=[
                            (REFUSED_HEADER.lower().encode(), b"refused"),
                            (b"content-type", b"text/plain; charset=utf-8"),
                            (b"content-length", str(len(body)).encode()),
                            (b"connection", b"close"),
                        ],
                    )
                )
                or b""
            )
            writer.write(inner.send(h11.Data(data=body)) or b"")
            writer.write(inner.send(h11.EndOfMessage()) or b"")
            await writer.drain()

    async def _read_head(self, conn: h11.Connection, reader: asyncio.StreamReader) -> h11.Request | None:
        read = 0
        while True:
            try:
                event = conn.next_event()
            except h11.RemoteProtocolError as exc:
                raise _Refused(f"a malformed request: {exc}", status=400) from None
            if isinstance(event, h11.Request):
                names = {name.lower() for name, _ in event.headers}
                if b"transfer-encoding" in names and b"content-length" in names:
                    # RFC 9112 lets a proxy read such a request as chunked; a server behind
                    # it may read the length instead: one request to one, two to the other.
                    raise _Refused("a malformed request: both Content-Length and Transfer-Encoding", status=400)
                return event
            if event is h11.NEED_DATA:
                if read > MAX_HEAD_BYTES:
                    raise _Refused(f"a malformed request: its head is over {MAX_HEAD_BYTES // 1024} KiB", status=400)
                data = await asyncio.wait_for(reader.read(CHUNK), timeout=self.limits.idle_s)
                if not data:
                    return None
                read += len(data)
                try:
                    conn.receive_data(data)
                except h11.RemoteProtocolError as exc:
                    raise _Refused(f"a malformed request: {exc}", status=400) from None
                continue
            return None

    async def _decide(self, method: str, host: str, port: int, request: h11.Request) -> str:
        """The address to connect to for ``host:port``, or :class:`_Refused` with why."""
        run = self.run
        if run.requests >= self.limits.max_requests:
            raise _Refused(f"this run's {self.limits.max_requests} requests are spent")
        run.requests += 1
        if run.bytes >= self.limits.max_bytes:
            raise _Refused(f"this run's {self.limits.max_bytes} bytes are spent")
        if _is_literal(host):
            raise _Refused(f"{host} is an IP address; the policy names hosts")
        # A brokered host is on the group's list by its credential.
        listed = self.policy.mode != "off" and host.lower().rstrip(".") in self.brokered
        refusal = (None if listed else host_refusal(self.policy, host, port)) or method_refusal(self.policy, method)
        if refusal is not None:
            if may_ask(self.policy, host, port):
                run.to_ask[(host.lower().rstrip("."), port)] = None
            raise _Refused(refusal)
        if method != "CONNECT" and any(name.lower() == b"upgrade" for name, _ in request.headers):
            raise _Refused("protocol upgrades are not forwarded over plain HTTP")
        pinned = self.resolve.get((host.lower().rstrip("."), port))
        if pinned is not None:
            if port in self.forbidden_ports:
                raise _Refused(f"port {port} is one of this installation's own services")
            return pinned
        loop = asyncio.get_running_loop()
        try:
            addresses = await asyncio.wait_for(
                loop.run_in_executor(None, self.resolver, host, port), timeout=self.limits.resolve_s
            )
        except TimeoutError:
            raise _Refused(f"resolving {host} took too long") from None
        except OSError as exc:
            raise _Refused(f"cannot resolve {host}: {exc}") from None
        if not addresses:
            raise _Refused(f"{host} resolves to no address")
        for text in addresses:
            try:
                address = ipaddress.ip_address(text.partition("%")[0])
            except ValueError:
                raise _Refused(f"{host} resolves to {text!r}, not an address") from None
            if not self.allowed(address):
                raise _Refused(f"{host} resolves to a non-public address ({address})")
            # A public name may be this host's own (its public address, or a resolver that
            # answers with one): the installation's services listen there.
            if port in self.forbidden_ports and is_this_host(address):
                raise _Refused(
                    f"{host} resolves to this host ({address}), and port {port} is one of this installation's own services"
                )
        return addresses[0]

    async def _forward_request(
        self,
        conn: h11.Connection,
        reader: asyncio.StreamReader,
        request: h11.Request,
        host: str,
        port: int,
        path: str,
        upstream: asyncio.StreamWriter,
        decision: Decision,
        *,
        default_port: int = 80,
        drop: frozenset[bytes] = frozenset(),
        extra: Sequence[tuple[bytes, bytes]] = (),
    ) -> None:
        """The request in origin form to the upstream, its body as h11 reads it (one framing
        only); ``drop`` the sandbox's headers of those names, ``extra`` added (a credential's)."""
        out = h11.Connection(h11.CLIENT)
        authority = host if port == default_port else f"{host}:{port}"
        headers = [(b"host", authority.encode("ascii"))]
        headers += [(n, v) for n, v in request.headers if n.lower() not in _HOP_BY_HOP and n.lower() not in drop]
        headers += [*extra, (b"connection", b"close")]
        head = out.send(h11.Request(method=request.method, target=path.encode("ascii"), headers=headers))
        assert head is not None
        upstream.write(head)
        decision.sent += self._charge(len(head))
        while True:
            event = conn.next_event()
            if event is h11.NEED_DATA:
                data = await asyncio.wait_for(reader.read(CHUNK), timeout=self.limits.idle_s)
                if not data:
                    raise ConnectionError("the client went away mid-request")
                conn.receive_data(data)
                continue
            if isinstance(event, h11.Data):
                chunk = out.send(h11.Data(data=event.data))
                if chunk:
                    decision.sent += self._charge(len(chunk))
                    upstream.write(chunk)
                    await upstream.drain()
                continue
            if isinstance(event, h11.EndOfMessage):
                tail = out.send(h11.EndOfMessage())
                if tail:
                    upstream.write(tail)
                await upstream.drain()
                return
            raise ConnectionError(f"unexpected {type(event).__name__} in a request")

    async def _splice(
        self,
        client_r: asyncio.StreamReader,
        client_w: asyncio.StreamWriter,
        upstream_r: asyncio.StreamReader,
        upstream_w: asyncio.StreamWriter,
        decision: Decision,
        *,
        client_done: bool,
    ) -> None:
        """Bytes both ways (the response only, for a plain request already sent) until one
        side ends, the run's bytes run out, or nothing moves for ``idle_s``."""

        async def pump(src: asyncio.StreamReader, dst: asyncio.StreamWriter, up: bool) -> None:
            while True:
                data = await asyncio.wait_for(src.read(CHUNK), timeout=self.limits.idle_s)
                if not data:
                    break
                n = self._charge(len(data))
                if up:
                    decision.sent += n
                else:
                    decision.received += n
                if n < len(data):
                    dst.write(data[:n])
                    await dst.drain()
                    raise ConnectionError("the run's egress bytes are spent")
                dst.write(data)
                await dst.drain()
            with contextlib.suppress(OSError):
                if dst.can_write_eof():
                    dst.write_eof()

        pumps = [asyncio.ensure_future(pump(upstream_r, client_w, False))]
        if not client_done:
            pumps.append(asyncio.ensure_future(pump(client_r, upstream_w, True)))
        try:
            done, pending = await asyncio.wait(pumps, return_when=asyncio.FIRST_EXCEPTION)
            for task in pending:
                if client_done:
                    continue
                # One direction ended cleanly: let the other finish within the idle bound.
                with contextlib.suppress(Exception):
                    await task
        finally:
            for task in pumps:
                task.cancel()

    def _charge(self, n: int) -> int:
        """Count ``n`` bytes against the run's budget; how many of them fit."""
        room = max(0, self.limits.max_bytes - self.run.bytes)
        taken = min(n, room)
        self.run.bytes += taken
        return taken

    def _record(self, decision: Decision) -> None:
        if len(self.run.decisions) < self.max_log:
            self.run.decisions.append(decision)
        else:
            self.run.left_out += 1
        log.info(
            "egress %s %s %s:%d: %s",
            "allowed" if decision.allowed else "refused",
            decision.method,
            decision.host,
            decision.port,
            decision.reason,
        )

    async def _refuse(self, writer: asyncio.StreamWriter, refused: _Refused, conn: h11.Connection | None) -> None:
        body = f"egress refused: {refused.reason}\n".encode()
        reason = b"Forbidden" if refused.status == 403 else b"Bad Request" if refused.status == 400 else b"Bad Gateway"
        writer.write(
            b"HTTP/1.1 %d %s\r\n%s: refused\r\nContent-Type: text/plain; charset=utf-8\r\n"
            b"Content-Length: %d\r\nConnection: close\r\n\r\n%s"
            % (refused.status, reason, REFUSED_HEADER.encode(), len(body), body)
        )
        with contextlib.suppress(Exception):
            await writer.drain()


def egress_proxy(settings: Settings, socket_path: Path, policy: EgressPolicy) -> EgressProxy:
    """The proxy of a run of a group with ``policy``, bounded by the settings (not started);
    with the installation's CA when the group gets brokered credentials."""
    credentials = parse_credentials(settings.egress_credentials)
    brokered = brokered_hosts(credentials, policy.credentials)
    # The CA is the installation's, for all its brokered hosts, not this group's few: one CA
    # for every group and run, made anew only when the installation's hosts change.
    ca = ensure_ca(settings.data_dir, credential_hosts(credentials), label=settings.install_id) if brokered else None
    # The operator's CA (tests, an on-premise host): the proxy trusts it for the brokered
    # hosts' upstream TLS, and the sandbox for the hosts it reaches through a tunnel.
    trusted = certificates_of(settings.egress_upstream_ca_file) if settings.egress_upstream_ca_file else b""
    upstream = ssl.create_default_context()
    if trusted:
        upstream.load_verify_locations(cadata=trusted.decode("ascii"))
    return EgressProxy(
        socket_path,
        policy,
        limits=Limits(
            max_requests=settings.egress_max_requests,
            max_bytes=settings.egress_max_bytes,
            max_connections=settings.egress_max_connections,
            idle_s=settings.egress_idle_s,
        ),
        resolve=parse_resolve(settings.egress_resolve_entries),
        forbidden_ports=settings.own_ports,
        brokered=brokered,
        ca=ca,
        upstream_tls=upstream,
        sandbox_trust=trusted,
    )


def _is_literal(host: str) -> bool:
    try:
        ipaddress.ip_address(host.strip("[]"))
    except ValueError:
        return False
    return True


def _authority(text: str, default_port: int | None) -> tuple[str, int]:
    """``host:port`` (``[v6]:port``) as a CONNECT line or a URL names it, held to what a rule
    can name before anything is decided or asked (a 400 otherwise): the host a name of the
    policy's grammar (``egress_policy.host_name``: lowercased, one trailing dot dropped; no
    ``*``, no ``_``, no empty label), the port digits from 1 to 65535 after exactly one colon
    outside brackets.  An IP literal is passed on as it is, for :meth:`EgressProxy._decide`
    to refuse in its own words."""
    if text.startswith("["):
        end = text.find("]")
        host_text, rest = (text, "") if end < 0 else (text[: end + 1], text[end + 1 :])
        if rest and not rest.startswith(":"):
            raise _Refused(f"{text!r} is no host:port", status=400)
        port_text = rest[1:] if rest else None
        if not _is_literal(host_text):
            raise _Refused(f"{text!r} is no host:port: {host_text!r} is no IPv6 address", status=400)
    else:
        if text.count(":") > 1:
            raise _Refused(f"{text!r} is no host:port: one colon, before the port", status=400)
        host_text, sep, port_text_or_empty = text.partition(":")
        port_text = port_text_or_empty if sep else None
    if port_text is None:
        if default_port is None:
            raise _Refused(f"{text!r} names no port", status=400)
        port = default_port
    else:
        try:
            port = port_number(port_text)
        except ValueError as exc:
            raise _Refused(f"{text!r} is no host:port: {exc}", status=400) from None
    if _is_literal(host_text):
        return host_text.strip("[]").lower(), port
    try:
        return host_name(host_text), port
    except ValueError as exc:
        raise _Refused(f"{text!r} is no host:port: {exc}", status=400) from None


def _origin(target: str) -> OriginTarget:
    """``target`` normalised once (``sandbox/request_paths.py``), or :class:`_Refused` (403) saying why."""
    try:
        return origin_target(target)
    except PathRefused as exc:
        raise _Refused(str(exc)) from None


def _absolute(target: str) -> tuple[str, int, str]:
    """A plain request's absolute-form target as (host, port, origin-form path), the path
    normalised as an intercepted request's is (``sandbox/request_paths.py``; its query as sent)."""
    try:
        parts = urlsplit(target)
    except ValueError as exc:  # an unclosed "[", among others
        raise _Refused(f"{target!r} is no URL: {exc}", status=400) from None
    if parts.scheme != "http" or not parts.netloc:
        raise _Refused(
            "a plain request names an http:// URL (HTTPS goes through CONNECT)"
            if parts.scheme != "https"
            else "https:// goes through CONNECT, not as a plain request",
            status=400,
        )
    if "@" in parts.netloc:
        raise _Refused("credentials in the URL are not forwarded", status=400)
    host, port = _authority(parts.netloc, default_port=80)
    path = parts.path or "/"
    if parts.query:
        path += "?" + parts.query
    return host, port, _origin(path).target
