"""A request the egress proxy refuses, and the answer the sandbox's client reads.

A refusal is ``403`` (the policy, a budget, an address), ``400`` (a request or target the
proxy cannot read as one meaning) or ``502`` (an allowed host that could not be reached),
with ``X-Orchestrator-Egress: refused`` and the reason as the body; the connection closes.
"""

from __future__ import annotations

import asyncio
import contextlib

REFUSED_HEADER = "X-Orchestrator-Egress"


class Refused(Exception):
    """One request refused, with why and the status that says so."""

    def __init__(self, reason: str, status: int = 403) -> None:
        super().__init__(reason)
        self.reason = reason
        self.status = status


async def refuse(writer: asyncio.StreamWriter, refused: Refused) -> None:
    """The refusal as the proxy's own answer, before any tunnel or forwarding."""
    body = f"egress refused: {refused.reason}\n".encode()
    reason = b"Forbidden" if refused.status == 403 else b"Bad Request" if refused.status == 400 else b"Bad Gateway"
    writer.write(
        b"HTTP/1.1 %d %s\r\n%s: refused\r\nContent-Type: text/plain; charset=utf-8\r\n"
        b"Content-Length: %d\r\nConnection: close\r\n\r\n%s"
        % (refused.status, reason, REFUSED_HEADER.encode(), len(body), body)
    )
    with contextlib.suppress(Exception):
        await writer.drain()
