"""kombu's Redis transport, with one client per channel for its commands.

kombu's Redis channel builds a new ``redis.Redis`` client object (over the
channel's shared connection pool) for every command it sends outside the
consumer's own loop: each task published, each event (a worker sends three a
task, for Flower), each ack.  Building one costs more than the command it
sends (~50 µs against ~35 µs for a ``PUBLISH`` on this machine), about a
sixth of a worker's CPU for an empty task (docs/performance.md, "The control
plane").  Here the channel keeps one client and hands it out again; a client
holds no state of its own but its pool (redis-py's clients are safe to share
between threads), and a new one is made when the channel's pool is replaced
(after a fork, kombu drops the pools and makes new ones).

``orchestrator/run/queue.py`` names this transport for ``redis://`` brokers.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

from kombu.transport import redis


class Channel(redis.Channel):
    _commands: Any = None

    @contextlib.contextmanager
    def conn_or_acquire(self, client: Any = None) -> Iterator[Any]:
        if client:
            yield client
            return
        pool = self.pool
        if self._commands is None or self._commands.connection_pool is not pool:
            self._commands = self._create_client()  # type: ignore[attr-defined]
        yield self._commands


class Transport(redis.Transport):
    Channel = Channel
