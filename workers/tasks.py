"""Thin Celery tasks: decode the signal, call orchestrator code, report.

``drain_group`` carries only a chat id, and so does ``deliver`` (send a
chat's due deliveries; ``orchestrator/run/outbound.py``).  Getting it twice, late, or for a
group that another worker is already serving is harmless: the pipeline's
lease makes the extra copy return at once.  ``sweep`` is run by beat and
once at worker start-up; ``fire_schedules`` by beat, to start scheduled tasks
that are due.  The main process of a worker that takes agent runs also
registers its host and beats it (``orchestrator/store/hosts.py``) from ready
to shutdown, and signals the groups whose lease holder is gone or that are
stranded on a host that takes no groups (``orchestrator/run/recovery.py``).

:func:`register` makes the four tasks for one Celery app and one
composition root: below, for the worker's (``workers.app``), when Celery
loads this module; a test registers the same tasks on an app of its own root
(a fake sandbox, recording channels) and runs them in an in-process worker
(``tests/host/test_worker_tasks.py``).  Each task works on the root it was
made for and is registered on that app alone (``shared=False``: not on every
Celery app the process finalizes later).
"""

from __future__ import annotations

import contextlib
import logging
from typing import Any, NamedTuple

from celery import Celery
from celery.signals import worker_ready, worker_shutdown, worker_shutting_down

from orchestrator.core import tracing
from orchestrator.root import Orchestrator
from orchestrator.run.queue import DELIVER_TASK, DRAIN_TASK, REPLAY_TASK, SCHEDULE_TASK, SWEEP_TASK
from orchestrator.run.recovery import RecoveryWatch
from orchestrator.run.schedules import fire_due
from orchestrator.run.sweeper import SweepReport
from orchestrator.store.hosts import HostHeartbeat

from .app import app, consumes_runs, orchestrator

log = logging.getLogger("workers")


class Tasks(NamedTuple):
    drain_group: Any
    sweep: Any
    fire_schedules: Any
    deliver: Any
    replay_run: Any


def _sweep_report(report: SweepReport) -> dict[str, object]:
    return {
        "interrupted_runs": report.interrupted_runs,
        "signalled_groups": report.signalled_groups,
        "removed_containers": report.removed_containers,
        "abandoned_deliveries": report.abandoned_deliveries,
        "delivery_signals": report.delivery_signals,
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
        return _sweep_report(root.sweep())

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


drain_group, sweep, fire_schedules, deliver, replay_run = register(app, orchestrator)


# This worker as its host in the hosts table (orchestrator/store/hosts.py),
# beaten from the main process only (worker_ready and worker_shutdown are
# sent there, never in a pool child), on a root of its own that forked
# children never touch.
_host: tuple[Orchestrator, HostHeartbeat] | None = None


def _concurrency(consumer: Any) -> int:
    controller = getattr(consumer, "controller", None)
    n = getattr(controller, "concurrency", None) or getattr(getattr(consumer, "pool", None), "num_processes", None)
    return n if isinstance(n, int) else 0


# Connected here, not in app.py: the app module must not import its tasks
# (Celery loads this module through the app's ``include`` before the worker
# is ready).  Connected before the start-up sweep: the host is registered first.
@worker_ready.connect
def _register_host(sender: Any = None, **_: object) -> None:
    global _host
    if _host is not None or getattr(sender, "app", None) is not app:
        return  # another app's worker in this process (a test's embedded one)
    if not consumes_runs(app):
        # A worker of deliveries alone (`up`'s deliverer, compose's) is no host: groups are
        # placed on hosts (store/placement.py), and its row would be taken from the host's
        # agent worker by the shared host id.
        log.info("this worker takes no agent runs: no host row, no recovery watch")
        return
    root = Orchestrator(orchestrator.settings)
    try:
        _host = (root, root.host_heartbeat(concurrency=_concurrency(sender)))
        log.info("host %s registered (heartbeat every %.0fs)", root.settings.effective_host_id, _host[1].interval_s)
    except Exception:  # noqa: BLE001 - a worker without a host row still works
        log.exception("could not start the host heartbeat")
        root.close()
        return
    _start_recovery_watch(root)


# Groups whose lease holder is gone (a SIGKILLed worker of this host, a dead
# host) signalled every few seconds (orchestrator/run/recovery.py), from the
# main process, on the host's root.
_watch: RecoveryWatch | None = None


def _start_recovery_watch(root: Orchestrator) -> None:
    global _watch
    try:
        _watch = root.recovery_watch()
    except Exception:  # noqa: BLE001 - the sweeper still recovers, only later
        log.exception("could not start the recovery watch")


def _stop_recovery_watch() -> None:
    global _watch
    if _watch is not None:
        _watch.stop()
        _watch = None


@worker_shutting_down.connect
def _host_draining(**_: object) -> None:
    # In Celery's signal handler: only flags are set here; the heartbeat thread writes.
    if _host is not None:
        _host[1].drain()


@worker_shutdown.connect
def _host_stopped(sender: Any = None, **_: object) -> None:
    global _host
    if _host is None or getattr(sender, "app", None) is not app:
        return
    root, heartbeat = _host
    _host = None
    try:
        _stop_recovery_watch()
        heartbeat.stop()
        _stop_idle_containers(root)
    finally:
        root.close()


def _stop_idle_containers(root: Orchestrator) -> None:
    """After the pool's last run: a stopped worker leaves no idle agent container behind."""
    if root.settings.warm_idle_s <= 0:
        return
    try:
        log.info("stopped %d idle warm or standby container(s) of this host", root.stop_idle_warm_containers())
    except Exception:  # noqa: BLE001 - the worker stops anyway; idle containers exit on their own later
        log.exception("could not stop this host's idle warm containers")


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
