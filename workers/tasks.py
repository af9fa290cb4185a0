"""Thin Celery tasks: decode the signal, call orchestrator code, report.

``drain_group`` carries only a chat id, and so does ``deliver`` (send a
chat's due deliveries; ``orchestrator/run/outbound.py``).  Getting it twice, late, or for a
group that another worker is already serving is harmless: the pipeline's
lease makes the extra copy return at once.  ``sweep`` is run by beat (and the
same sweep once at worker start-up, ``workers/host.py``); ``fire_schedules`` by
beat, to start scheduled tasks that are due.

:func:`register` makes the five tasks for one Celery app and one composition
root: ``workers/app.py`` registers them on the worker's app as it builds its
root; a test registers the same tasks on an app of its own root (a fake
sandbox, recording channels) and runs them in an in-process worker
(``tests/host/test_worker_tasks.py``).  Each task works on the root it was
made for and is registered on that app alone (``shared=False``: not on every
Celery app the process finalizes later).  Importing this module registers
nothing and builds nothing.
"""

from __future__ import annotations

import contextlib
from typing import Any, NamedTuple

from celery import Celery

from orchestrator.core import tracing
from orchestrator.root import Orchestrator
from orchestrator.run.queue import DELIVER_TASK, DRAIN_TASK, REPLAY_TASK, SCHEDULE_TASK, SWEEP_TASK
from orchestrator.run.schedules import fire_due
from orchestrator.run.sweeper import SweepReport


class Tasks(NamedTuple):
    drain_group: Any
    sweep: Any
    fire_schedules: Any
    deliver: Any
    replay_run: Any


def sweep_report(report: SweepReport) -> dict[str, object]:
    """A sweep's report as the task returns it (and the start-up sweep logs it)."""
    return {
        "interrupted_runs": report.interrupted_runs,
        "signalled_groups": report.signalled_groups,
        "removed_containers": report.removed_containers,
        "abandoned_deliveries": report.abandoned_deliveries,
        "delivery_signals": report.delivery_signals,
        "freed_files": report.freed_files,
        "expired_questions": report.expired_questions,
        "deleted_egress_logs": report.deleted_egress_logs,
    }


def _task_span(request: Any, name: str, chat_jid: str | None) -> contextlib.AbstractContextManager[None]:
    """The task's consumer span (tracing on), a child of the signal's span whose context came
    in the message's headers (orchestrator/run/queue.py); a new trace without one."""
    return tracing.span(
        name,
        kind="consumer",
        parent=getattr(request, tracing.HEADER, None) or tracing.ROOT,
        attributes={"orchestrator.chat_jid": chat_jid, "celery.task_id": request.id},
    )


def register(app: Celery, root: Orchestrator) -> Tasks:
    """The tasks on ``app``, working on ``root``."""

    @app.task(name=DRAIN_TASK, bind=True, acks_late=True, shared=False)
    def drain_group(self, chat_jid: str) -> dict[str, object]:  # type: ignore[no-untyped-def]
        # One attempt at one run per task (Pipeline.step): Celery's time
        # limits, sized for one run, never cut a later one, and a retry's
        # backoff is a countdown on the broker, not a sleep in this slot.
        with _task_span(self.request, "task drain_group", chat_jid):
            step = root.pipeline.step(chat_jid, task_id=self.request.id)
            root.pipeline.follow_up(chat_jid, step, root.signals.group)
        run = step.outcome.run if step.outcome is not None else None
        return {
            "chat_jid": chat_jid,
            "run": None
            if run is None
            else {
                "id": run.id,
                "state": run.state,
                "attempts": run.attempts,
                "outputs": len(step.outcome.stored) if step.outcome else 0,
            },
            "more": step.more,
            "retry_in": step.retry_in,
            "busy": step.busy,
        }

    @app.task(name=SWEEP_TASK, acks_late=False, ignore_result=True, shared=False)
    def sweep() -> dict[str, object]:
        return sweep_report(root.sweep())

    @app.task(name=SCHEDULE_TASK, acks_late=False, ignore_result=True, shared=False)
    def fire_schedules() -> list[str]:
        return fire_due(root.db, signal=root.signals.group)

    @app.task(name=DELIVER_TASK, bind=True, acks_late=True, ignore_result=True, shared=False)
    def deliver(self, chat_jid: str | None = None) -> dict[str, object]:  # type: ignore[no-untyped-def]
        with _task_span(self.request, "task deliver", chat_jid):
            report = root.deliverer(only_known=False).deliver_and_reschedule(chat_jid, root.signals.delivery)
        return {
            "chat_jid": chat_jid,
            "sent": report.sent,
            "failed_attempts": report.failed_attempts,
            "retry_in": report.retry_in,
        }

    @app.task(name=REPLAY_TASK, bind=True, acks_late=True, shared=False)
    def replay_run(self, run_id: str) -> dict[str, object]:  # type: ignore[no-untyped-def]
        # A replay (POST /api/runs/{id}/replay): one run in a cold container on a scratch
        # copy of the workspace; a second delivery of this task finds it taken and returns.
        from orchestrator.run.replay import execute_replay

        with _task_span(self.request, "task replay_run", None):
            run = execute_replay(root.db, root.settings, root.docker, run_id)
        return {"run": run.id, "replay_of": run.replay_of, "state": run.state}

    return Tasks(drain_group, sweep, fire_schedules, deliver, replay_run)
