"""The Celery application's configuration and the "look at group G" signal.

Celery messages are signals, not data: the database holds the pending work,
so a signal that is lost, late or delivered twice is harmless (a lease makes
the second copy return at once).
"""

from __future__ import annotations

import time

from celery import Celery
from kombu import Queue

from orchestrator.core.errors import OrchestratorError
from orchestrator.core.settings import Settings

AGENT_QUEUE = "agent"
DELIVERY_QUEUE = "delivery"
DRAIN_TASK = "workers.tasks.drain_group"
SWEEP_TASK = "workers.tasks.sweep"
SCHEDULE_TASK = "workers.tasks.fire_schedules"
DELIVER_TASK = "workers.tasks.deliver"


def make_celery(settings: Settings) -> Celery:
    settings.ensure_dirs()
    broker = settings.effective_broker_url
    transport_options: dict[str, object] = {
        # Longer than the longest run, so Redis never redelivers a live task.
        "visibility_timeout": int(settings.run_timeout_s * 2 + 600),
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
        )
    elif broker.startswith(("sqla+", "sqlalchemy")):
        transport_options["polling_interval"] = settings.broker_polling_interval
    app = Celery("orchestrator", broker=broker, include=["workers.tasks"])
    app.conf.update(
        # filesystem:// through our race-free subclass of kombu's transport (orchestrator/run/fs_transport.py).
        broker_transport="orchestrator.run.fs_transport:Transport" if broker.startswith("filesystem") else None,
        broker_transport_options=transport_options,
        broker_connection_retry_on_startup=True,
        task_ignore_result=True,
        result_backend=None,
        task_acks_late=True,
        task_reject_on_worker_lost=True,
        worker_prefetch_multiplier=1,
        task_default_queue=AGENT_QUEUE,
        task_queues=[Queue(AGENT_QUEUE), Queue(DELIVERY_QUEUE)],
        task_routes={
            DRAIN_TASK: {"queue": AGENT_QUEUE},
            SWEEP_TASK: {"queue": DELIVERY_QUEUE},
            SCHEDULE_TASK: {"queue": DELIVERY_QUEUE},
            DELIVER_TASK: {"queue": DELIVERY_QUEUE},
        },
        beat_schedule={
            "sweep": {"task": SWEEP_TASK, "schedule": settings.sweep_interval_s, "options": {"expires": settings.sweep_interval_s}},
            "scheduled-tasks": {
                "task": SCHEDULE_TASK, "schedule": settings.schedule_tick_s,
                "options": {"expires": settings.schedule_tick_s},
            },
        },
        task_serializer="json",
        accept_content=["json"],
        # Flower sees every task only with these on.
        worker_send_task_events=True,
        task_send_sent_event=True,
        task_soft_time_limit=settings.run_timeout_s + 30,
        task_time_limit=settings.run_timeout_s + 90,
        worker_hijack_root_logger=False,
    )
    return app


_app: Celery | None = None


def get_celery(settings: Settings) -> Celery:
    global _app
    if _app is None:
        _app = make_celery(settings)
    return _app


def forget_celery() -> None:
    """Drop the cached app (a process that talks to several installs in turn: benchmarks)."""
    global _app
    _app = None


class BrokerUnavailable(OrchestratorError):
    """The broker refused a signal recently; the sweeper will re-send it."""


# After a failed publish, stop trying for a few seconds: with the broker down,
# every ingest would otherwise wait out its own retries, and the signal is
# only an optimisation (the pending mark in the database is the truth).
_BREAKER_S = 5.0
_broken_until = 0.0


def signal_group(settings: Settings, chat_jid: str) -> str:
    """Ask some worker to drain ``chat_jid``; call only after the DB commit."""
    global _broken_until
    if time.monotonic() < _broken_until:
        raise BrokerUnavailable("the broker failed moments ago; leaving the signal to the sweeper")
    try:
        return _publish(settings, chat_jid)
    except Exception:
        _broken_until = time.monotonic() + _BREAKER_S
        raise


def _publish(settings: Settings, chat_jid: str) -> str:
    # Fail fast when the broker is down: the pending mark is already in the
    # database and the sweeper re-signals, so blocking the sender buys nothing.
    result = get_celery(settings).send_task(
        DRAIN_TASK, args=[chat_jid], queue=AGENT_QUEUE,
        retry=True, retry_policy={"max_retries": 2, "interval_start": 0, "interval_step": 0.2, "interval_max": 0.5},
    )
    return result.id


def signal_delivery(settings: Settings, chat_jid: str | None, countdown: float | None = None) -> str:
    """Ask some worker to send ``chat_jid``'s due deliveries (None: every chat's),
    now or after ``countdown`` seconds; call only after the DB commit.

    Like the drain signal it only says "look": the rows are the truth, and the
    sweeper re-signals whatever is due if this one is lost.
    """
    global _broken_until
    if time.monotonic() < _broken_until:
        raise BrokerUnavailable("the broker failed moments ago; leaving the signal to the sweeper")
    try:
        result = get_celery(settings).send_task(
            DELIVER_TASK, args=[chat_jid], queue=DELIVERY_QUEUE, countdown=countdown,
            retry=True, retry_policy={"max_retries": 2, "interval_start": 0, "interval_step": 0.2, "interval_max": 0.5},
        )
    except Exception:
        _broken_until = time.monotonic() + _BREAKER_S
        raise
    return result.id
