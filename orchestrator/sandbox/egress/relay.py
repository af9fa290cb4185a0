"""HTTP/1.1 through the egress proxy: a request's head read strictly, a request forwarded,
bytes spliced both ways, an answer relayed; every byte charged to the run's account.

`h11` parses every head strictly: two ``Content-Length``s, or ``Transfer-Encoding`` beside
one, are refused (no smuggling past the proxy).  A forwarded request goes in origin form
with ``Host`` set from its target and ``Connection: close``, its body as h11 reads it (one
framing only), hop-by-hop headers dropped.  Nothing waits longer than the run's idle bound.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Sequence

import h11

from orchestrator.sandbox.egress.account import Decision, RunAccount
from orchestrator.sandbox.egress.refusals import Refused

MAX_HEAD_BYTES = 32 * 1024
CHUNK = 64 * 1024
HOP_BY_HOP = frozenset(
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


async def read_head(conn: h11.Connection, reader: asyncio.StreamReader, idle_s: float) -> h11.Request | None:
    """A request's head as h11 reads it, strictly; None when the client went away first."""
    read = 0
    while True:
        try:
            event = conn.next_event()
        except h11.RemoteProtocolError as exc:
            raise Refused(f"a malformed request: {exc}", status=400) from None
        if isinstance(event, h11.Request):
            names = {name.lower() for name, _ in event.headers}
            if b"transfer-encoding" in names and b"content-length" in names:
                # RFC 9112 lets a proxy read such a request as chunked; a server behind
                # it may read the length instead: one request to one, two to the other.
                raise Refused("a malformed request: both Content-Length and Transfer-Encoding", status=400)
            return event
        if event is h11.NEED_DATA:
            if read > MAX_HEAD_BYTES:
                raise Refused(f"a malformed request: its head is over {MAX_HEAD_BYTES // 1024} KiB", status=400)
            data = await asyncio.wait_for(reader.read(CHUNK), timeout=idle_s)
            if not data:
                return None
            read += len(data)
            try:
                conn.receive_data(data)
            except h11.RemoteProtocolError as exc:
                raise Refused(f"a malformed request: {exc}", status=400) from None
            continue
        return None


async def forward_request(
    conn: h11.Connection,
    reader: asyncio.StreamReader,
    request: h11.Request,
    host: str,
    port: int,
    path: str,
    upstream: asyncio.StreamWriter,
    decision: Decision,
    run: RunAccount,
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
    headers += [(n, v) for n, v in request.headers if n.lower() not in HOP_BY_HOP and n.lower() not in drop]
    headers += [*extra, (b"connection", b"close")]
    head = out.send(h11.Request(method=request.method, target=path.encode("ascii"), headers=headers))
    assert head is not None
    upstream.write(head)
    decision.sent += run.charge(len(head))
    while True:
        event = conn.next_event()
        if event is h11.NEED_DATA:
            data = await asyncio.wait_for(reader.read(CHUNK), timeout=run.limits.idle_s)
            if not data:
                raise ConnectionError("the client went away mid-request")
            conn.receive_data(data)
            continue
        if isinstance(event, h11.Data):
            chunk = out.send(h11.Data(data=event.data))
            if chunk:
                decision.sent += run.charge(len(chunk))
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


async def splice(
    client_r: asyncio.StreamReader,
    client_w: asyncio.StreamWriter,
    upstream_r: asyncio.StreamReader,
    upstream_w: asyncio.StreamWriter,
    decision: Decision,
    run: RunAccount,
    *,
    client_done: bool,
) -> None:
    """Bytes both ways (the response only, for a plain request already sent) until one
    side ends, the run's bytes run out, or nothing moves for ``idle_s``."""

    async def pump(src: asyncio.StreamReader, dst: asyncio.StreamWriter, up: bool) -> None:
        while True:
            data = await asyncio.wait_for(src.read(CHUNK), timeout=run.limits.idle_s)
            if not data:
                break
            n = run.charge(len(data))
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


async def relay_response(
    upstream: asyncio.StreamReader,
    writer: asyncio.StreamWriter,
    inner: h11.Connection,
    decision: Decision,
    method: bytes,
    run: RunAccount,
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
            data = await asyncio.wait_for(upstream.read(CHUNK), timeout=run.limits.idle_s)
            client.receive_data(data)
            continue
        if isinstance(event, h11.InformationalResponse):
            continue
        if isinstance(event, h11.Response):
            headers = [(n, v) for n, v in event.headers if n.lower() not in HOP_BY_HOP]
            out = inner.send(h11.Response(status_code=event.status_code, headers=[*headers, (b"connection", b"close")]))
        elif isinstance(event, h11.Data):
            n = run.charge(len(event.data))
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
