"""Thin Celery tasks: decode the signal, call orchestrator code, report.

``drain_group`` carries only a chat id, and so does ``deliver`` (send a
chat's due deliveries; ``orchestrator/run/outbound.py``).  Getting it twice, late, or for a
group that another worker is already serving is harmless: the pipeline's
lease makes the extra copy return at once.  ``sweep`` is run by beat and
once at worker start-up; ``fire_schedules`` by beat, to start scheduled tasks
that are due.

:func:`register` makes the four tasks for one Celery app and one
composition root: below, for the worker's (``workers.app``), when Celery
loads this module; a test registers the same tasks on an app of its own root
(a fake sandbox, recording channels) and runs them in an in-process worker
(``tests/host/test_worker_tasks.py``).  Each task works on the root it was
made for and is registered on that app alone (``shared=False``: not on every
Celery app the process finalizes later).
"""

from __future__ import annotations

import logging
from typing import Any, NamedTuple

from celery import Celery
from celery.signals import worker_ready

from orchestrator.root import Orchestrator
from orchestrator.run.queue import DELIVER_TASK, DRAIN_TASK, SCHEDULE_TASK, SWEEP_TASK
from orchestrator.run.schedules import fire_due
from orchestrator.run.sweeper import SweepReport

from .app import app, orchestrator

log = logging.getLogger("workers")


class Tasks(NamedTuple):
    drain_group: Any
    sweep: Any
    fire_schedules: Any
    deliver: Any


def _sweep_report(report: SweepReport) -> dict[str, object]:
    return {
        "interrupted_runs": report.interrupted_runs,
        "signalled_groups": report.signalled_groups,
        "removed_containers": report.removed_containers,
        "abandoned_deliveries": report.abandoned_deliveries,
        "delivery_signals": report.delivery_signals,
    }


def register(app: Celery, root: Orchestrator) -> Tasks:
    """The tasks on ``app``, working on ``root``."""

    @app.task(name=DRAIN_TASK, bind=True, acks_late=True, shared=False)
    def drain_group(self, chat_jid: str) -> dict[str, object]:  # type: ignore[no-untyped-def]
        outcomes = root.pipeline.drain_group(chat_jid, task_id=self.request.id)
        return {
            "chat_jid": chat_jid,
            "runs": [{"id": o.run.id, "state": o.run.state, "outputs": len(o.stored)} for o in outcomes],
        }

    @app.task(name=SWEEP_TASK, acks_late=False, ignore_result=True, shared=False)
    def sweep() -> dict[str, object]:
        return _sweep_report(root.sweep())

    @app.task(name=SCHEDULE_TASK, acks_late=False, ignore_result=True, shared=False)
    def fire_schedules() -> list[str]:
        return fire_due(root.db, signal=root.signals.group)

    @app.task(name=DELIVER_TASK, acks_late=True, ignore_result=True, shared=False)
    def deliver(chat_jid: str | None = None) -> dict[str, object]:
        report = root.deliverer(only_known=False).deliver_and_reschedule(chat_jid, root.signals.delivery)
        return {"chat_jid": chat_jid, "sent": report.sent, "failed_attempts": report.failed_attempts,
                "retry_in": report.retry_in}

    return Tasks(drain_group, sweep, fire_schedules, deliver)


drain_group, sweep, fire_schedules, deliver = register(app, orchestrator)


# Connected here, not in app.py: the app module must not import its tasks
# (Celery loads this module through the app's ``include`` before the worker
# is ready).
@worker_ready.connect
def _sweep_at_start(**_: object) -> None:
    # A worker that restarts after a crash finds what its predecessor left:
    # runs to close, groups to re-signal, containers to remove.
    # Its own root, closed after: the pool children forked later must not
    # inherit this process's database or Docker connections.
    once = Orchestrator(orchestrator.settings)
    try:
        log.info("start-up sweep: %s", _sweep_report(once.sweep()))
    except Exception:  # noqa: BLE001 - a failed sweep must not stop the worker
        log.exception("start-up sweep failed")
    finally:
        once.close()
