"""A run's egress account: its bounds, what it has spent, and the log of its decisions.

A run's requests, bytes (both ways), open connections and idle time are bounded
(:class:`Limits`: the settings', narrowed by the group's policy).  Every request's fate is a
:class:`Decision`, kept up to the log's cap and counted past it; the run's egress log
(``run/egress_log.py``) stores them with the run.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field

log = logging.getLogger(__name__)


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
class RunAccount:
    """What one run's proxy has let through so far, against ``limits``."""

    limits: Limits
    max_log: int = 500
    requests: int = 0
    bytes: int = 0
    connections: int = 0
    decisions: list[Decision] = field(default_factory=list)
    left_out: int = 0
    # The hosts refused in ``ask`` mode, in the order first asked: the chat is asked about them.
    to_ask: dict[tuple[str, int], None] = field(default_factory=dict)

    def charge(self, n: int) -> int:
        """Count ``n`` bytes against the run's budget; how many of them fit."""
        room = max(0, self.limits.max_bytes - self.bytes)
        taken = min(n, room)
        self.bytes += taken
        return taken

    def record(self, decision: Decision) -> None:
        if len(self.decisions) < self.max_log:
            self.decisions.append(decision)
        else:
            self.left_out += 1
        log.info(
            "egress %s %s %s:%d: %s",
            "allowed" if decision.allowed else "refused",
            decision.method,
            decision.host,
            decision.port,
            decision.reason,
        )
