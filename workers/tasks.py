"""Thin Celery tasks: decode the signal, call orchestrator code, report.

``drain_group`` carries only a chat id.  Getting it twice, late, or for a
group that another worker is already serving is harmless: the pipeline's
lease makes the extra copy return at once.  ``sweep`` is run by beat and
once at worker start-up; ``fire_schedules`` by beat, to start scheduled tasks
that are due.
"""

from __future__ import annotations

from functools import lru_cache, partial

from celery.exceptions import SoftTimeLimitExceeded

from orchestrator.channels import ChannelRegistry, LogChannel
from orchestrator.db import get_database
from orchestrator.pipeline import Pipeline
from orchestrator.queue import DRAIN_TASK, SCHEDULE_TASK, SWEEP_TASK, signal_group
from orchestrator.schedules import fire_due
from orchestrator.settings import get_settings
from orchestrator.sweeper import sweep as run_sweep

from .app import app


@lru_cache(maxsize=1)
def _pipeline() -> Pipeline:
    settings = get_settings()
    channels = ChannelRegistry(settings.assistant_name)
    channels.add(LogChannel())
    pipeline = Pipeline(settings, get_database(settings), channels)
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
        deliver=pipeline.channels.deliver,
    )
    return {
        "interrupted_runs": report.interrupted_runs,
        "signalled_groups": report.signalled_groups,
        "removed_containers": report.removed_containers,
    }


@app.task(name=SWEEP_TASK, acks_late=False, ignore_result=True)
def sweep() -> dict[str, object]:
    return sweep_now()


@app.task(name=SCHEDULE_TASK, acks_late=False, ignore_result=True)
def fire_schedules() -> list[str]:
    pipeline = _pipeline()
    return fire_due(pipeline.db, signal=partial(signal_group, pipeline.settings))
