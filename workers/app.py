"""The Celery application.  Run a worker with::

    celery -A workers.app worker -Q agent,delivery
    # or: orchestrator worker

A worker that takes runs (``agent``) also consumes its host's own queue
(``agent.<host id>``, ``run/queue.py``'s ``host_queue``), where the signals of
the groups placed on its host go (``orchestrator/store/placement.py``).

``orchestrator`` is this process's composition root
(``orchestrator/root.py``): the tasks take the database, the pipeline and
the signals from it.

Metrics (``orchestrator/core/metrics.py``): with ``ORCHESTRATOR_METRICS_PORT``
set, a worker's main process serves ``/metrics`` for itself and its pool
children (:func:`_multiprocess_metrics`, :func:`_serve_metrics`).
"""

from __future__ import annotations

import logging
import os
import re
import shutil
import sys
from pathlib import Path
from typing import Any
from wsgiref.simple_server import WSGIServer

from celery.exceptions import SoftTimeLimitExceeded
from celery.signals import (
    celeryd_after_setup,
    setup_logging,
    worker_init,
    worker_process_init,
    worker_process_shutdown,
    worker_ready,
    worker_shutdown,
)
from kombu import Exchange, Queue

from orchestrator.core import heap, tracing
from orchestrator.core.settings import Settings
from orchestrator.root import Orchestrator
from orchestrator.run.queue import AGENT_QUEUE, host_queue

orchestrator = Orchestrator.from_environment(deadline_exceptions=(SoftTimeLimitExceeded,))
app = orchestrator.celery
log = logging.getLogger("workers")


def _multiprocess_metrics(settings: Settings, argv: list[str]) -> Path | None:
    """In a worker's main process with ``ORCHESTRATOR_METRICS_PORT`` set: a fresh, empty
    folder for this worker's metric files, named in ``PROMETHEUS_MULTIPROC_DIR``.

    The project's one write to the environment (the settings object stays its only
    reader).  prometheus_client decides, when ``prometheus_client.values`` is first
    imported, whether a process counts in its own memory or in a file of that folder,
    and it decides by this variable alone.  The ``celery`` command has imported it
    already (Flower's plugin to that command line does), so its choice is made again
    here, before any of our metrics exists: orchestrator/core/metrics.py is imported
    later (Celery loads ``workers.tasks`` through the app's ``include``: the run
    path).  Pool children are forked with this environment, so every process of
    this worker writes its counts there and the main process serves their sum
    (``_serve_metrics``).  A folder per worker process (``<host id>-<pid>``), emptied
    now and removed at exit: the counts of an earlier worker are never added to this
    one's.  Other commands that load this app (beat, flower) and processes that
    import it (tests) are left alone.
    """
    if not settings.metrics_port or "worker" not in argv[1:]:
        return None
    if "orchestrator.core.metrics" in sys.modules:
        # Our metrics already count in memory: the pool's counts could not be added up.
        log.error("metrics: orchestrator.core.metrics was imported before workers.app; this worker serves no metrics")
        return None
    host = re.sub(r"[^A-Za-z0-9._-]", "_", settings.effective_host_id)
    folder = settings.effective_metrics_dir / f"{host}-{os.getpid()}"
    shutil.rmtree(folder, ignore_errors=True)
    folder.mkdir(parents=True)
    os.environ["PROMETHEUS_MULTIPROC_DIR"] = str(folder)
    if "prometheus_client.values" in sys.modules:
        import prometheus_client.values as values

        # Metrics made from now on read the class here when they are built (the ones made
        # before, Flower's, stay in memory: not this worker's to serve).
        values.ValueClass = values.get_value_class()  # type: ignore[no-untyped-call]
    return folder


_metrics_dir = _multiprocess_metrics(orchestrator.settings, sys.argv)
_metrics_pid = os.getpid()  # the worker's main process, the folder's owner
_metrics_server: WSGIServer | None = None


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
    # What the child inherited and built lives as long as it: never scanned again (core/heap.py).
    heap.settle()


@worker_ready.connect
def _log_quota_mode(**_: object) -> None:
    # Which way workspaces are kept under their quota here (orchestrator/sandbox/quota.py).
    from orchestrator.sandbox.quota import describe_mode

    line = describe_mode(orchestrator.settings)
    (log.warning if "quota: off" in line else log.info)("%s", line)


@worker_ready.connect
def _serve_metrics(sender: Any = None, **_: object) -> None:
    # The main process serves /metrics from a thread: the sum of its pool children's
    # counts (and its own: the start-up sweep's).  A taken port is logged, not fatal.
    global _metrics_server
    if _metrics_dir is None or _metrics_server is not None or getattr(sender, "app", None) is not app:
        return
    from orchestrator.core.metrics import serve_multiprocess

    settings = orchestrator.settings
    _metrics_server = serve_multiprocess(_metrics_dir, settings.metrics_host, settings.metrics_port)


@worker_process_shutdown.connect
def _metrics_process_dead(pid: int | None = None, **_: object) -> None:
    # In the pool child that ends: prometheus_client drops its live gauges (its counts stay summed).
    if _metrics_dir is not None:
        from orchestrator.core.metrics import process_dead

        process_dead(pid or os.getpid(), _metrics_dir)


@worker_process_shutdown.connect
def _flush_spans(**_: object) -> None:
    # A pool child ends without atexit: the spans still in its batch go now (core/tracing.py).
    tracing.flush()


@worker_shutdown.connect
def _flush_main_spans(**_: object) -> None:
    tracing.flush()


@worker_shutdown.connect
def _stop_metrics(sender: Any = None, **_: object) -> None:
    global _metrics_server
    if _metrics_server is not None:
        _metrics_server.shutdown()
        _metrics_server.server_close()
        _metrics_server = None
    if _metrics_dir is not None and os.getpid() == _metrics_pid:
        shutil.rmtree(_metrics_dir, ignore_errors=True)
