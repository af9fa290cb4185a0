"""The signals' circuit breaker, against a real Celery app whose broker refuses connections.

After a failed publish every signal gives up at once for a few seconds
(``BrokerUnavailable``) instead of waiting out its own retries; then it tries
the broker again.  The broker is Redis on a loopback port nobody listens on.
"""

from __future__ import annotations

import socket

import pytest
from celery import Celery
from kombu.exceptions import OperationalError

from orchestrator.core.settings import Settings
from orchestrator.run.queue import BrokerUnavailable, Signals, make_celery


def _closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])  # free once the socket is closed: connections are refused


def test_a_refused_publish_opens_the_breaker_for_a_few_seconds(settings: Settings) -> None:
    down = settings.replace(**{"broker_url": f"redis://127.0.0.1:{_closed_port()}/0"})
    now = [1000.0]
    made: list[object] = []

    def make_app() -> Celery:
        made.append(1)
        return make_celery(down)

    signals = Signals(make_app, monotonic=lambda: now[0])
    assert made == []  # no Celery app until the first signal
    with pytest.raises(OperationalError):
        signals.group("g@local")
    with pytest.raises(BrokerUnavailable):  # at once: no retries against a broker that just failed
        signals.delivery("g@local")
    now[0] += 4.9
    with pytest.raises(BrokerUnavailable):
        signals.group("g@local")
    now[0] += 0.2  # past the breaker's 5 s: the broker is tried again
    with pytest.raises(OperationalError):
        signals.group("g@local")
    assert made == [1]  # one app for every signal
