"""The Celery application's configuration and the signals sent through it.

Celery messages are signals, not data: the database holds the pending work,
so a signal that is lost, late or delivered twice is harmless (a lease makes
the second copy return at once).  A group's drain signal goes to the queue
of the host it is placed on (``host_queue``; ``orchestrator/store/placement.py``)
while that host takes groups, else to the shared ``agent`` queue.
"""

from __future__ import annotations

import enum
import hashlib
import logging
import re
import time
from collections.abc import Callable
from functools import cached_property
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from celery import Celery

from orchestrator.core import tracing
from orchestrator.core.errors import BrokerUnavailable
from orchestrator.core.settings import Settings

AGENT_QUEUE = "agent"
DELIVERY_QUEUE = "delivery"
# A host's own queue is AGENT_QUEUE + "." + its id made safe (host_queue).
_UNSAFE = re.compile(r"[^A-Za-z0-9_-]")
DRAIN_TASK = "workers.tasks.drain_group"
SWEEP_TASK = "workers.tasks.sweep"
SCHEDULE_TASK = "workers.tasks.fire_schedules"
DELIVER_TASK = "workers.tasks.deliver"
# Runs a queued replay (orchestrator/run/replay.py) on a worker with the Docker engine.
REPLAY_TASK = "workers.tasks.replay_run"


log = logging.getLogger(__name__)


def host_queue(host_id: str) -> str:
    """The agent queue of one host (``ORCHESTRATOR_HOST_ID``): where the drain signals
    of the groups placed on it go (``orchestrator/store/placement.py``).  Every
    agent worker consumes it besides the shared ``agent`` queue (``workers/app.py``).

    Letters, digits, ``-`` and ``_`` only (a dot would let the ``filesystem://``
    broker, which finds a queue's files by ``.<queue>.msg``, hand one host's
    messages to another), with a hash of the id when anything was replaced, so
    two ids never share a queue."""
    safe = _UNSAFE.sub("_", host_id)[:80]
    if safe != host_id:
        safe += "-" + hashlib.sha256(host_id.encode()).hexdigest()[:10]
    return f"{AGENT_QUEUE}.{safe}"


def make_celery(settings: Settings) -> Celery:
    # Celery and kombu are imported here, not at the top: a process that
    # only stores a message (the CLI's send) must not pay for them first.
    from celery import Celery
    from kombu import Exchange, Queue

    settings.ensure_dirs()
    broker = settings.effective_broker_url
    transport_options: dict[str, object] = {
        # Longer than the longest run, so Redis never redelivers a live task.
        "visibility_timeout": int(settings.runs.run_timeout_s * 2 + 600),
    }
    if broker.startswith("filesystem"):
        transport_options.update(
            data_folder_in=str(settings.broker_dir / "out"),
            data_folder_out=str(settings.broker_dir / "out"),
            processed_folder=str(settings.broker_dir / "processed"),
            # Fanout bindings (events, remote control); kombu's default is
            # "control" in the working directory, which must not be written.
            control_folder=str(settings.broker_dir / "control"),
            store_processed=False,
            polling_interval=settings.broker_polling_interval,
            wakeup=settings.broker_wakeup,
        )
    elif broker.startswith(("sqla+", "sqlalchemy")):
        transport_options["polling_interval"] = settings.broker_polling_interval
    # No include=: workers/app.py registers the tasks on the worker's app as it builds it.
    app = Celery("orchestrator", broker=broker)
    app.conf.update(
        broker_transport=_transport(broker),
        broker_transport_options=transport_options,
        broker_connection_retry_on_startup=True,
        task_ignore_result=True,
        result_backend=None,
        task_acks_late=True,
        task_reject_on_worker_lost=True,
        worker_prefetch_multiplier=1,
        task_default_queue=AGENT_QUEUE,
        # Each queue on its own direct exchange and key, as Celery makes the
        # host queues (workers/app.py).  Declared without them, "agent" and
        # "delivery" were both bound to exchange "agent" with key "agent":
        # harmless while Celery publishes to the nameless exchange by queue
        # name, but any publish to that exchange would land in both queues.
        task_queues=[Queue(name, Exchange(name), routing_key=name) for name in (AGENT_QUEUE, DELIVERY_QUEUE)],
        task_routes={
            DRAIN_TASK: {"queue": AGENT_QUEUE},
            SWEEP_TASK: {"queue": DELIVERY_QUEUE},
            SCHEDULE_TASK: {"queue": DELIVERY_QUEUE},
            DELIVER_TASK: {"queue": DELIVERY_QUEUE},
        },
        beat_schedule={
            "sweep": {
                "task": SWEEP_TASK,
                "schedule": settings.fleet.sweep_interval_s,
                "options": {"expires": settings.fleet.sweep_interval_s},
            },
            "scheduled-tasks": {
                "task": SCHEDULE_TASK,
                "schedule": settings.fleet.schedule_tick_s,
                "options": {"expires": settings.fleet.schedule_tick_s},
            },
        },
        task_serializer="json",
        accept_content=["json"],
        # Flower sees every task only with these on.
        worker_send_task_events=True,
        task_send_sent_event=True,
        task_soft_time_limit=settings.runs.run_timeout_s + 30,
        task_time_limit=settings.runs.run_timeout_s + 90,
        worker_hijack_root_logger=False,
    )
    return app


def _transport(broker: str) -> str | None:
    """Our subclasses of kombu's transports: filesystem:// race-free
    (orchestrator/run/fs_transport.py), redis:// with one client per channel
    (orchestrator/run/redis_transport.py); None: kombu's own for the URL."""
    if broker.startswith("filesystem"):
        return "orchestrator.run.fs_transport:Transport"
    if broker.startswith("redis://"):  # not rediss:// (TLS) nor sentinel: kombu's own parse them
        return "orchestrator.run.redis_transport:Transport"
    return None


# After a failed publish, stop trying for a few seconds: with the broker down,
# every ingest would otherwise wait out its own retries, and the signal is
# only an optimisation (the pending mark in the database is the truth).
_BREAKER_S = 5.0
# Fail fast when the broker is down: the pending mark is already in the
# database and the sweeper re-signals, so blocking the sender buys nothing.
_RETRY_POLICY = {"max_retries": 2, "interval_start": 0, "interval_step": 0.2, "interval_max": 0.5}


class Placement(enum.Enum):
    """``Signals.group(host=LOOK_UP)``: the signal reads where the group is placed itself."""

    LOOK_UP = "look up"


LOOK_UP = Placement.LOOK_UP


class Signals:
    """The two signals a process sends: "drain group G" and "deliver chat C's due messages".

    Call them only after the database commit.  ``make_app`` makes the Celery
    app on first use (the CLI pays for Celery only when it signals).
    ``placement`` says which host a group is placed on (the composition root
    passes ``store.placement.placed_on``); without it every drain signal goes
    to the shared queue.  After a
    failed publish every signal raises
    :class:`BrokerUnavailable` for a few seconds instead of waiting out its
    own retries.
    """

    def __init__(
        self,
        make_app: Callable[[], Celery],
        *,
        monotonic: Callable[[], float] = time.monotonic,
        placement: Callable[[str], str | None] | None = None,
    ) -> None:
        self._make_app = make_app
        self._monotonic = monotonic
        self._broken_until = 0.0
        # The host a group's signal goes to (store/placement.py's placed_on), None: the shared queue.
        self._placement = placement

    @cached_property
    def app(self) -> Celery:
        return self._make_app()

    def group(self, chat_jid: str, countdown: float | None = None, *, host: str | None | Placement = LOOK_UP) -> str:
        """Ask some worker to take ``chat_jid``'s next step, now or after
        ``countdown`` seconds (a parked run's retry): a worker of the host the
        group is placed on, if it has a live one (:meth:`queue_for`).  ``host``:
        that host (None: none) as the caller read it in its own transaction, so no
        look-up is made (ingest's, through :func:`signal_group`)."""
        self._check_breaker()
        queue = self.queue_for(chat_jid) if host is LOOK_UP else AGENT_QUEUE if host is None else host_queue(host)
        return self._send(DRAIN_TASK, [chat_jid], queue, countdown)

    def queue_for(self, chat_jid: str) -> str:
        """Where ``chat_jid``'s drain signal goes: the queue of the host it is placed on
        while that host takes groups, else the shared agent queue (a failed look-up
        too: any agent worker may serve any group, placement only keeps them together)."""
        if self._placement is None:
            return AGENT_QUEUE
        try:
            host = self._placement(chat_jid)
        except Exception as exc:  # noqa: BLE001 - the shared queue is always right
            log.warning("could not read where %s is placed (%s); signalling the shared queue", chat_jid, exc)
            return AGENT_QUEUE
        return AGENT_QUEUE if host is None else host_queue(host)

    def delivery(self, chat_jid: str | None, countdown: float | None = None) -> str:
        """Ask some worker to send ``chat_jid``'s due deliveries (None: every
        chat's), now or after ``countdown`` seconds.

        Like the drain signal it only says "look": the rows are the truth, and
        the sweeper re-signals whatever is due if this one is lost.
        """
        return self._send(DELIVER_TASK, [chat_jid], DELIVERY_QUEUE, countdown)

    def replay(self, run_id: str, chat_jid: str) -> str:
        """Ask a worker to run the queued replay ``run_id`` of ``chat_jid``'s run: on the
        queue of the host the group is placed on, where its workspace is."""
        return self._send(REPLAY_TASK, [run_id], self.queue_for(chat_jid))

    def _check_breaker(self) -> None:
        if self._monotonic() < self._broken_until:
            raise BrokerUnavailable("the broker failed moments ago; leaving the signal to the sweeper")

    def _send(self, task: str, args: list[str | None], queue: str, countdown: float | None = None) -> str:
        self._check_breaker()
        # With tracing on: a producer span, whose context the task's span continues from
        # the message's headers (workers/tasks.py); off: no span, no header.
        with tracing.span(
            f"signal {task.rpartition('.')[2]}",
            kind="producer",
            attributes={
                "messaging.system": "celery",
                "messaging.destination.name": queue,
                "orchestrator.chat_jid": args[0] if args else None,
                "orchestrator.countdown_s": countdown,
            },
        ):
            try:
                result = self.app.send_task(
                    task,
                    args=args,
                    queue=queue,
                    countdown=countdown,
                    retry=True,
                    retry_policy=_RETRY_POLICY,
                    headers=tracing.headers(),
                )
            except Exception:
                self._broken_until = self._monotonic() + _BREAKER_S
                raise
            tracing.annotate(task_id=str(result.id))
        return str(result.id)


def signal_group(signal: Callable[[str], object], chat_jid: str, host: str | None) -> object:
    """Call ``signal`` for ``chat_jid`` whose place the caller has just read (``host``,
    ``store.hosts.place_sql``): a :class:`Signals`' ``group`` is told it and makes
    no look-up of its own (ingest's hot path: no round trip more than before
    placement); any other callable (a test's recorder) is called as always."""
    owner = getattr(signal, "__self__", None)
    if isinstance(owner, Signals) and getattr(signal, "__func__", None) is Signals.group:
        return owner.group(chat_jid, host=host)
    return signal(chat_jid)
