"""The signals' circuit breaker, against a real Celery app whose broker refuses connections.

After a failed publish every signal gives up at once for a few seconds
(``BrokerUnavailable``) instead of waiting out its own retries; then it tries
the broker again.  The broker is Redis on a loopback port nobody listens on.
"""

from __future__ import annotations

import base64
import json
import os
import socket

import pytest
from celery import Celery
from kombu.exceptions import OperationalError

from orchestrator.core.errors import BrokerUnavailable
from orchestrator.core.settings import Settings
from orchestrator.run.queue import Signals, host_queue, make_celery
from tests.conftest import REDIS_URL, redis_available, require_service


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


@pytest.mark.parametrize("broker", ["embedded", "redis"])
def test_each_signal_lands_in_its_own_queue_only(settings: Settings, broker: str) -> None:
    # A deliverer consumes "delivery" only and an agent worker "agent" (and its
    # host's queue): a signal copied into another queue would make a deliverer
    # take agent runs, or run every drain twice.
    if broker == "redis":
        require_service(redis_available(), f"a Redis server at {REDIS_URL}")
        local = settings.replace(broker_url=REDIS_URL.rsplit("/", 1)[0] + "/12")
        import redis

        redis.Redis.from_url(local.broker_url).flushdb()  # kombu keeps bindings in Redis across runs
    else:
        local = settings.replace(broker_url="")
    signals = Signals(lambda: make_celery(local))
    app = signals.app
    # Each queue on its own exchange and key: a publish to one queue's exchange reaches
    # that queue only (declared without them, "agent" and "delivery" shared one binding).
    bindings = {name: (q.exchange.name, q.exchange.type, q.routing_key) for name, q in app.amqp.queues.items()}
    assert bindings == {"agent": ("agent", "direct", "agent"), "delivery": ("delivery", "direct", "delivery")}
    with app.connection_for_write() as conn:
        channel = conn.default_channel

        def counts() -> dict[str, int]:
            names = ("agent", "delivery", host_queue("host-a"))
            return {name: channel.queue_declare(name, passive=False).message_count for name in names}

        for name in counts():
            channel.queue_purge(name)
        signals.delivery("g@local")
        signals.group("g@local")
        signals.group("h@local", host="host-a")
        signals.delivery(None)
        try:
            assert counts() == {"agent": 1, "delivery": 2, host_queue("host-a"): 1}
        finally:
            for name in counts():
                channel.queue_purge(name)


def test_a_redis_channel_sends_its_commands_through_one_client(
    settings: Settings,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """kombu's Redis channel built a ``redis.Redis`` client for every command it sent
    (each task published, each event, each ack: more CPU than the command itself);
    ours keeps one per channel (orchestrator/run/redis_transport.py), and every
    signal still lands, with its Flower event."""
    require_service(redis_available(), f"a Redis server at {REDIS_URL}")
    import redis

    local = settings.replace(broker_url=REDIS_URL.rsplit("/", 1)[0] + "/12")
    redis.Redis.from_url(local.broker_url).flushdb()
    signals = Signals(lambda: make_celery(local))
    app = signals.app
    assert type(app.connection_for_write().transport).__module__ == "orchestrator.run.redis_transport"
    events = redis.Redis.from_url(local.broker_url).pubsub()
    # The events' fanout topic (Redis pub/sub spans every database: other processes' events
    # arrive too, and are told apart by their sender's pid below).
    events.psubscribe("*celeryev/task.sent")
    events.get_message(timeout=1)  # the subscription's own confirmation
    signals.group("warm-up@local")  # the channel and its client are made once
    built = []
    real_init = redis.Redis.__init__

    def counting_init(self: redis.Redis, *args: object, **kwargs: object) -> None:
        built.append(1)
        real_init(self, *args, **kwargs)

    monkeypatch.setattr(redis.Redis, "__init__", counting_init)
    for i in range(20):
        signals.group(f"g{i}@local")
    monkeypatch.setattr(redis.Redis, "__init__", real_init)
    assert built == []
    queued = redis.Redis.from_url(local.broker_url).llen("agent")
    assert queued == 21
    sent = []
    while (m := events.get_message(timeout=1)) is not None:
        if m["type"] == "pmessage":
            event = json.loads(base64.b64decode(json.loads(m["data"])["body"]))
            if event.get("pid") == os.getpid():
                sent.append(event)
    assert len(sent) == 21 and {e["type"] for e in sent} == {"task-sent"}
