"""The egress proxy's server: the run's proxy on a unix socket, one request per connection.

A run whose group's network policy is not ``off`` (``sandbox/egress_policy.py``) gets a
proxy of its own (:func:`egress_proxy`), started and stopped with its attempt beside the
model gateway, in the worker, on a thread and an asyncio loop of its own.  It listens on
:data:`EGRESS_SOCKET` in the run's host-only folder (bound through a descriptor of that
folder, no symlink followed), mounted read-only into the container as the gateway's is.

Per connection it reads one request's head (``relay.py``), parses its target
(``targets.py``), decides (``decision.py``) and records the decision in the run's account
(``account.py``); then it tunnels a ``CONNECT``, intercepts a brokered host's
(``interception.py``), or forwards a plain HTTP request in origin form; a refusal is
answered as ``refusals.py`` says.  The run's open connections are capped: one past the
cap is closed at once.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import socket
import ssl
import threading
import time
from collections.abc import Callable
from pathlib import Path

import h11

from orchestrator.core.addresses import is_public
from orchestrator.core.errors import GatewayError
from orchestrator.core.settings import Settings
from orchestrator.sandbox.egress.account import Decision, Limits, RunAccount
from orchestrator.sandbox.egress.decision import Address, Decider, Resolver, system_resolver
from orchestrator.sandbox.egress.interception import Interceptor
from orchestrator.sandbox.egress.refusals import Refused, refuse
from orchestrator.sandbox.egress.relay import MAX_HEAD_BYTES, forward_request, read_head, splice
from orchestrator.sandbox.egress.targets import absolute, authority, parse_resolve
from orchestrator.sandbox.egress_ca import InstallationCA, certificates_of, credential_hosts, ensure_ca
from orchestrator.sandbox.egress_credentials import BrokeredCredential, brokered_hosts, parse_credentials
from orchestrator.sandbox.egress_policy import EgressPolicy
from orchestrator.sandbox.gateway import chmod_socket

EGRESS_SOCKET = "egress.sock"
# The CA bundle a sandbox with brokered hosts trusts (the system's CAs and the installation's).
EGRESS_CA_BUNDLE = "egress-ca.pem"
# A unix socket's path (sun_path) holds at most this many bytes on Linux.
_MAX_UNIX_PATH = 107


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
        allowed: Callable[[Address], bool] = is_public,
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
        self.max_log = max_log
        self.run = RunAccount(self.limits, max_log)
        # Hosts whose requests carry a brokered credential: TLS to them is ended here, with a
        # leaf certificate of ``ca`` (minted once per host and run), and made anew upstream.
        self.brokered = brokered or {}
        self.ca = ca
        self.upstream_tls = upstream_tls or ssl.create_default_context()
        # Certificates (PEM) the sandbox trusts besides the system's and ``ca``'s, for TLS it
        # makes itself through a tunnel (the run's bundle: run/attempt.py).
        self.sandbox_trust = sandbox_trust
        self._decider = Decider(
            policy=policy,
            run=self.run,
            brokered=self.brokered,
            resolve=resolve or {},
            forbidden_ports=forbidden_ports,
            resolver=resolver,
            # Which resolved addresses may be reached (every one a name resolves to must be).
            allowed=allowed,
        )
        self._interceptor = Interceptor(ca, self.upstream_tls, policy, self.run) if ca is not None else None
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
            request = await read_head(conn, reader, self.limits.idle_s)
        except Refused as refused:
            await refuse(writer, refused)
            return
        if request is None:
            return
        method = request.method.decode("ascii", "replace").upper()
        target = request.target.decode("ascii", "replace")
        decision = Decision(time.time(), method, "", 0, False, "")
        try:
            if method == "CONNECT":
                host, port = authority(target, default_port=None)
            else:
                host, port, path = absolute(target)
            decision.host, decision.port = host, port
            address = await self._decider.decide(method, host, port, request)
        except Refused as refused:
            decision.reason = refused.reason
            self.run.record(decision)
            await refuse(writer, refused)
            return
        decision.allowed, decision.reason = True, "allowed"
        credential = self.brokered.get(host) if method == "CONNECT" else None
        if credential is not None and self._interceptor is not None:
            decision.reason = f"intercepted for the credential {credential.name!r}"
            self.run.record(decision)
            await self._interceptor.intercept(reader, writer, conn, host, port, address, credential)
            return
        self.run.record(decision)
        try:
            upstream_r, upstream_w = await asyncio.wait_for(
                asyncio.open_connection(address, port), timeout=self.limits.connect_s
            )
        except (TimeoutError, OSError) as exc:
            decision.reason = f"allowed; the connection failed: {exc or 'timed out'}"
            await refuse(writer, Refused(f"cannot connect to {host}:{port}", status=502))
            return
        try:
            if method == "CONNECT":
                writer.write(b"HTTP/1.1 200 Connection established\r\n\r\n")
                await writer.drain()
                early = conn.trailing_data[0]
                if early:
                    decision.sent += self.run.charge(len(early))
                    upstream_w.write(early)
            else:
                await forward_request(conn, reader, request, host, port, path, upstream_w, decision, self.run)
            await splice(reader, writer, upstream_r, upstream_w, decision, self.run, client_done=method != "CONNECT")
        finally:
            with contextlib.suppress(Exception):
                upstream_w.close()


def egress_proxy(settings: Settings, socket_path: Path, policy: EgressPolicy) -> EgressProxy:
    """The proxy of a run of a group with ``policy``, bounded by the settings (not started);
    with the installation's CA when the group gets brokered credentials."""
    credentials = parse_credentials(settings.egress.credentials)
    brokered = brokered_hosts(credentials, policy.credentials)
    # The CA is the installation's, for all its brokered hosts, not this group's few: one CA
    # for every group and run, made anew only when the installation's hosts change.
    ca = ensure_ca(settings.data_dir, credential_hosts(credentials), label=settings.install_id) if brokered else None
    # The operator's CA (tests, an on-premise host): the proxy trusts it for the brokered
    # hosts' upstream TLS, and the sandbox for the hosts it reaches through a tunnel.
    trusted = certificates_of(settings.egress.upstream_ca_file) if settings.egress.upstream_ca_file else b""
    upstream = ssl.create_default_context()
    if trusted:
        upstream.load_verify_locations(cadata=trusted.decode("ascii"))
    return EgressProxy(
        socket_path,
        policy,
        limits=Limits(
            max_requests=settings.egress.max_requests,
            max_bytes=settings.egress.max_bytes,
            max_connections=settings.egress.max_connections,
            idle_s=settings.egress.idle_s,
        ),
        resolve=parse_resolve(settings.egress.resolve_entries),
        forbidden_ports=settings.own_ports,
        brokered=brokered,
        ca=ca,
        upstream_tls=upstream,
        sandbox_trust=trusted,
    )
