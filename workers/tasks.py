"""Thin Celery tasks: decode the signal, call orchestrator code, report.

``drain_group`` carries only a chat id, and so does ``deliver`` (send a
chat's due deliveries; ``orchestrator/deliveries.py``).  Getting it twice, late, or for a
group that another worker is already serving is harmless: the pipeline's
lease makes the extra copy return at once.  ``sweep`` is run by beat and
once at worker start-up; ``fire_schedules`` by beat, to start scheduled tasks
that are due.
"""

from __future__ import annotations

from functools import lru_cache, partial

from celery.exceptions import SoftTimeLimitExceeded

from orchestrator.channels import build_registry
from orchestrator.db import get_database
from orchestrator.deliveries import Deliverer
from orchestrator.pipeline import Pipeline
from orchestrator.queue import DELIVER_TASK, DRAIN_TASK, SCHEDULE_TASK, SWEEP_TASK, signal_delivery, signal_group
from orchestrator.schedules import fire_due
from orchestrator.settings import get_settings
from orchestrator.sweeper import sweep as run_sweep

from .app import app


@lru_cache(maxsize=1)
def _pipeline() -> Pipeline:
    settings = get_settings()
    pipeline = Pipeline(settings, get_database(settings), build_registry(settings),
                        signal_delivery=partial(signal_delivery, settings))
    pipeline.deadline_exceptions = (SoftTimeLimitExceeded,)
    return pipeline


@app.task(name=DRAIN_TASK, bind=True, acks_late=True)
def drain_group(self, chat_jid: str) -> dict[str, object]:  # type: ignore[no-untyped-def]
    outcomes = _pipeline().drain_group(chat_jid, task_id=self.request.id)
    return {
        "chat_jid": chat_jid,
        "runs": [{"id": o.run.id, "state": o.run.state, "outputs": len(o.stored)} for o in outcomes],
    }


def sweep_now() -> dict[str, object]:
    pipeline = _pipeline()
    report = run_sweep(
        pipeline.db,
        signal=partial(signal_group, pipeline.settings),
        sandbox=pipeline.sandbox,
        signal_delivery=partial(signal_delivery, pipeline.settings),
    )
    return {
        "interrupted_runs": report.interrupted_runs,
        "signalled_groups": report.signalled_groups,
        "removed_containers": report.removed_containers,
        "abandoned_deliveries": report.abandoned_deliveries,
        "delivery_signals": report.delivery_signals,
    }


@app.task(name=SWEEP_TASK, acks_late=False, ignore_result=True)
def sweep() -> dict[str, object]:
    return sweep_now()


@app.task(name=SCHEDULE_TASK, acks_late=False, ignore_result=True)
def fire_schedules() -> list[str]:
    pipeline = _pipeline()
    return fire_due(pipeline.db, signal=partial(signal_group, pipeline.settings))


@app.task(name=DELIVER_TASK, acks_late=True, ignore_result=True)
def deliver(chat_jid: str | None = None) -> dict[str, object]:
    pipeline = _pipeline()
    report = Deliverer(pipeline.db, pipeline.settings, pipeline.channels, only_known=False).deliver_and_reschedule(
        chat_jid, partial(signal_delivery, pipeline.settings)
    )
    return {"chat_jid": chat_jid, "sent": report.sent, "failed_attempts": report.failed_attempts,
            "retry_in": report.retry_in}
