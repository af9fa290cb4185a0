"""The Celery application.  Run a worker with::

    celery -A workers.app worker -Q agent,delivery
    # or: orchestrator worker

A worker that takes runs (``agent``) also consumes its host's own queue
(``agent.<host id>``, ``run/queue.py``'s ``host_queue``), where the signals of
the groups placed on its host go (``orchestrator/store/placement.py``).

``orchestrator`` is this process's composition root
(``orchestrator/root.py``): the tasks take the database, the pipeline and
the signals from it.
"""

from __future__ import annotations

import logging
from typing import Any

from celery.exceptions import SoftTimeLimitExceeded
from celery.signals import celeryd_after_setup, setup_logging, worker_init, worker_process_init, worker_ready
from kombu import Exchange, Queue

from orchestrator.root import Orchestrator
from orchestrator.run.queue import AGENT_QUEUE, host_queue

orchestrator = Orchestrator.from_environment(deadline_exceptions=(SoftTimeLimitExceeded,))
app = orchestrator.celery
log = logging.getLogger("workers")


@setup_logging.connect
def _logging(loglevel: object = None, **_: object) -> None:
    # Ours instead of Celery's (a receiver here turns Celery's off): the same lines as
    # every other process, text or JSON with the run's context (orchestrator/core/logs.py).
    from orchestrator.core.logs import configure

    configure(orchestrator.settings, loglevel if isinstance(loglevel, (str, int)) and loglevel else None)


@worker_init.connect
def _prove_data_dir(sender: object = None, **_: object) -> None:
    # Before this worker takes any work: it must see the installation's data
    # dir, or a group's runs here and elsewhere would see two workspaces
    # (orchestrator/store/installation.py).  Refusing is better than splitting.
    if getattr(sender, "app", None) is not app:
        return  # another app's worker in this process (a test's embedded one)
    from orchestrator.store.installation import DataDirNotShared, prove_data_dir

    try:
        prove_data_dir(orchestrator.db, orchestrator.settings)
    except DataDirNotShared as exc:
        log.critical("refusing to start: %s", exc)
        raise SystemExit(f"refusing to start: {exc}") from exc


def consumes_runs(celery: Any = None) -> bool:
    """Whether this worker takes agent runs (its ``-Q`` has the shared agent queue,
    or it has no ``-Q``): such a worker is a host of the fleet, groups are placed on it."""
    return AGENT_QUEUE in (celery or app).amqp.queues.consume_from


@celeryd_after_setup.connect
def _consume_host_queue(sender: object = None, instance: Any = None, **_: object) -> None:
    # A worker that takes runs also takes those of the groups placed on its host
    # (orchestrator/store/placement.py): its host's own queue, besides the shared one,
    # whatever -Q said.  Here, not on the command line, so the queue is always the
    # one of the host id this process registers and beats (workers/tasks.py).
    celery = getattr(instance, "app", None)
    if celery is not app or not consumes_runs(celery):
        return
    name = host_queue(orchestrator.settings.effective_host_id)
    celery.amqp.queues.select_add(Queue(name, Exchange(name), routing_key=name))
    log.info("taking runs from the shared queue %s and from this host's own, %s", AGENT_QUEUE, name)


@worker_process_init.connect
def _fresh_connections(**_: object) -> None:
    # A forked pool child must not share the parent's database connections.
    orchestrator.after_fork()
    logging.getLogger("orchestrator").setLevel(orchestrator.settings.log_level)


@worker_ready.connect
def _log_quota_mode(**_: object) -> None:
    # Which way workspaces are kept under their quota here (orchestrator/sandbox/quota.py).
    from orchestrator.sandbox.quota import describe_mode

    line = describe_mode(orchestrator.settings)
    (log.warning if "quota: off" in line else log.info)("%s", line)
