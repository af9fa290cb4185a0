"""TLS interception for a brokered host: the one place the egress proxy reads inside a tunnel.

A CONNECT to a host with a brokered credential (``sandbox/egress_credentials.py``) is not
tunnelled: its TLS is ended here with a leaf certificate of the installation's CA
(``sandbox/egress_ca.py``, minted once per host and run), one request is read, its path
normalised once (``sandbox/request_paths.py``) and held to the credential's methods and
paths, and it goes upstream over TLS made anew, as normalised, with the credential's
header (the sandbox's own of that name dropped).  The answer is relayed and the
connection ends.  A refusal inside the ended TLS is what the sandbox's client reads as the
host's answer.
"""

from __future__ import annotations

import asyncio
import contextlib
import ssl
import time

import h11

from orchestrator.sandbox.egress.account import Decision, RunAccount
from orchestrator.sandbox.egress.refusals import REFUSED_HEADER, Refused, refuse
from orchestrator.sandbox.egress.relay import MAX_HEAD_BYTES, forward_request, read_head, relay_response
from orchestrator.sandbox.egress_ca import InstallationCA
from orchestrator.sandbox.egress_credentials import BrokeredCredential
from orchestrator.sandbox.egress_policy import EgressPolicy, method_refusal
from orchestrator.sandbox.request_paths import OriginTarget, PathRefused, origin_target


class Interceptor:
    """A run's TLS interception: the installation's ``ca`` for the sandbox's side, ``upstream``
    trust for the host's, the group's ``policy`` and the run's account."""

    def __init__(self, ca: InstallationCA, upstream: ssl.SSLContext, policy: EgressPolicy, run: RunAccount) -> None:
        self.ca = ca
        self.upstream_tls = upstream
        self.policy = policy
        self.run = run
        self._leaves: dict[str, ssl.SSLContext] = {}

    async def intercept(
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
        if conn.trailing_data[0]:
            # Bytes before our 200: no TLS client sends them; nothing to end TLS on.
            await refuse(writer, Refused("bytes sent before the tunnel was open", status=400))
            return
        writer.write(b"HTTP/1.1 200 Connection established\r\n\r\n")
        await writer.drain()
        if host not in self._leaves:
            self._leaves[host] = self.ca.server_context(host)
        await asyncio.wait_for(writer.start_tls(self._leaves[host]), timeout=self.run.limits.idle_s)
        inner = h11.Connection(h11.SERVER, max_incomplete_event_size=MAX_HEAD_BYTES)
        try:
            request = await read_head(inner, reader, self.run.limits.idle_s)
        except Refused as refused:
            await _answer_inner(writer, inner, refused.status, refused.reason)
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
        if refusal is not None or self.run.requests >= self.run.limits.max_requests:
            decision.reason = refusal or f"this run's {self.run.limits.max_requests} requests are spent"
            self.run.record(decision)
            await _answer_inner(writer, inner, 403, decision.reason)
            return
        assert target is not None  # no refusal: the target was normalised
        self.run.requests += 1
        decision.allowed, decision.reason = True, f"credential {credential.name!r} added"
        self.run.record(decision)
        upstream_r, upstream_w = await asyncio.wait_for(
            asyncio.open_connection(address, port, ssl=self.upstream_tls, server_hostname=host),
            timeout=self.run.limits.connect_s,
        )
        try:
            header = credential.header.lower().encode("ascii")
            await forward_request(
                inner,
                reader,
                request,
                host,
                port,
                target.target,
                upstream_w,
                decision,
                self.run,
                default_port=443,
                drop=frozenset({header}),
                extra=[(header, credential.value.encode("latin-1"))],
            )
            await relay_response(upstream_r, writer, inner, decision, request.method, self.run)
        finally:
            with contextlib.suppress(Exception):
                upstream_w.close()


async def _answer_inner(writer: asyncio.StreamWriter, inner: h11.Connection, status: int, reason: str) -> None:
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
