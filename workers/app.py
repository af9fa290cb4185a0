"""The Celery application.  Run a worker with::

    celery -A workers.app worker -Q agent,delivery
    # or: orchestrator worker

A worker that takes runs (``agent``) also consumes its host's own queue
(``agent.<host id>``, ``run/queue.py``'s ``host_queue``), where the signals of
the groups placed on its host go (``orchestrator/store/placement.py``).

Importing this module builds nothing: no settings read, no folder made, no
root.  The worker's composition root (``orchestrator/root.py``; the tasks take
the database, the pipeline and the signals from it) is built on first use, by
:func:`worker_root`, which also registers the tasks of ``workers/tasks.py`` on
its Celery app.  ``app``, the name ``celery -A workers.app`` looks up, is that
app, built when first read (PEP 562): as the worker, beat or Flower starts.

The process-wide set-up (log lines, the secrets kept out of what the process
writes, trace exporters: ``orchestrator/core/process.py``) is made on Celery's
``setup_logging``, in the main process of a worker or beat, before the pool forks.

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
import threading
from pathlib import Path
from typing import TYPE_CHECKING, Any
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
    worker_shutting_down,
)
from kombu import Exchange, Queue

from orchestrator.core import heap, tracing
from orchestrator.core.settings import Settings
from orchestrator.root import Orchestrator
from orchestrator.run.queue import AGENT_QUEUE, host_queue

if TYPE_CHECKING:
    from celery import Celery

    app: Celery  # the worker root's app, made when first read (__getattr__)

log = logging.getLogger("workers")

_lock = threading.Lock()
_root: Orchestrator | None = None
_metrics_dir: Path | None = None
_metrics_pid = 0  # the worker's main process, the metrics folder's owner
_metrics_server: WSGIServer | None = None


def worker_root() -> Orchestrator:
    """This process's worker root, built from the environment on first use, its app holding
    the tasks of ``workers/tasks.py``."""
    global _root, _metrics_dir, _metrics_pid
    with _lock:
        if _root is None:
            settings = Settings.load()
            # Before the tasks' modules are imported: they bring orchestrator/core/metrics.py.
            _metrics_dir, _metrics_pid = _multiprocess_metrics(settings, sys.argv), os.getpid()
            root = Orchestrator(settings, deadline_exceptions=(SoftTimeLimitExceeded,))
            from workers.tasks import register

            register(root.celery, root)
            _root = root
        return _root


def __getattr__(name: str) -> Any:
    # ``app`` is read by Celery's -A (and by modules that run this app's worker), not at import.
    if name == "app":
        return worker_root().celery
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def _ours(sender: Any) -> Orchestrator | None:
    """The worker root when ``sender`` (a worker, a consumer) runs its app; None for another app's
    worker in this process (a test's embedded one)."""
    root = _root
    return root if root is not None and getattr(sender, "app", None) is root.celery else None


def _multiprocess_metrics(settings: Settings, argv: list[str]) -> Path | None:
    """In a worker's main process with ``ORCHESTRATOR_METRICS_PORT`` set: a fresh, empty
    folder for this worker's metric files, named in ``PROMETHEUS_MULTIPROC_DIR``.

    The project's one write to the environment (the settings object stays its only
    reader).  prometheus_client decides, when ``prometheus_client.values`` is first
    imported, whether a process counts in its own memory or in a file of that folder,
    and it decides by this variable alone.  The ``celery`` command has imported it
    already (Flower's plugin to that command line does), so its choice is made again
    here, before any of our metrics exists: orchestrator/core/metrics.py is imported
    later (:func:`worker_root` imports ``workers/tasks.py``, the run path, after this).  Pool children are forked with this environment, so every process of
    this worker writes its counts there and the main process serves their sum
    (``_serve_metrics``).  A folder per worker process (``<host id>-<pid>``), emptied
    now and removed at exit: the counts of an earlier worker are never added to this
    one's.  Other commands that load this app (beat, flower) and processes that
    build its root without running a worker (tests) are left alone.
    """
    if not settings.telemetry.metrics_port or "worker" not in argv[1:]:
        return None
    if "orchestrator.core.metrics" in sys.modules:
        # Our metrics already count in memory: the pool's counts could not be added up.
        log.error("metrics: orchestrator.core.metrics was imported before workers.app; this worker serves no metrics")
        return None
    host = re.sub(r"[^A-Za-z0-9._-]", "_", settings.fleet.effective_host_id)
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


@setup_logging.connect
def _set_up_process(loglevel: object = None, **_: object) -> None:
    # Ours instead of Celery's logging (a receiver here turns Celery's off): the same lines
    # as every other process, text or JSON with the run's context (orchestrator/core/logs.py).
    # Then the rest of the process-wide set-up, in the worker's (or beat's) main process
    # before the pool forks, so its children inherit it: the secrets kept out of what they
    # write, the trace exporters.  The entry point's to make, not the root's (core/process.py).
    root = _root
    if root is None:
        return  # not a process of this app (Celery asks for its root as it starts)
    from orchestrator.core.logs import configure
    from orchestrator.core.process import set_up_process

    configure(root.settings, loglevel if isinstance(loglevel, (str, int)) and loglevel else None)
    set_up_process(root.settings)


@worker_init.connect
def _prove_data_dir(sender: object = None, **_: object) -> None:
    # Before this worker takes any work: it must see the installation's data
    # dir, or a group's runs here and elsewhere would see two workspaces
    # (orchestrator/store/installation.py).  Refusing is better than splitting.
    root = _ours(sender)
    if root is None:
        return  # another app's worker in this process (a test's embedded one)
    from orchestrator.core.errors import DataDirNotShared
    from orchestrator.store.installation import prove_data_dir

    try:
        prove_data_dir(root.db, root.settings)
    except DataDirNotShared as exc:
        log.critical("refusing to start: %s", exc)
        raise SystemExit(f"refusing to start: {exc}") from exc


def consumes_runs(celery: Any) -> bool:
    """Whether a worker of ``celery`` takes agent runs (its ``-Q`` has the shared agent queue,
    or it has no ``-Q``): such a worker is a host of the fleet, groups are placed on it."""
    return AGENT_QUEUE in celery.amqp.queues.consume_from


@celeryd_after_setup.connect
def _consume_host_queue(sender: object = None, instance: Any = None, **_: object) -> None:
    # A worker that takes runs also takes those of the groups placed on its host
    # (orchestrator/store/placement.py): its host's own queue, besides the shared one,
    # whatever -Q said.  Here, not on the command line, so the queue is always the
    # one of the host id this process registers and beats (workers/host.py).
    root = _ours(instance)
    if root is None or not consumes_runs(root.celery):
        return
    name = host_queue(root.settings.fleet.effective_host_id)
    root.celery.amqp.queues.select_add(Queue(name, Exchange(name), routing_key=name))
    log.info("taking runs from the shared queue %s and from this host's own, %s", AGENT_QUEUE, name)


@worker_process_init.connect
def _fresh_connections(**_: object) -> None:
    # A forked pool child must not share the parent's database connections.
    root = _root
    if root is None:
        return
    root.after_fork()
    logging.getLogger("orchestrator").setLevel(root.settings.telemetry.log_level)
    # What the child inherited and built lives as long as it: never scanned again (core/heap.py).
    heap.settle()


@worker_ready.connect
def _log_quota_mode(sender: Any = None, **_: object) -> None:
    # Which way workspaces are kept under their quota here (orchestrator/sandbox/quota/mode.py).
    root = _ours(sender)
    if root is None:
        return
    from orchestrator.sandbox.quota import describe_mode

    line = describe_mode(root.settings)
    (log.warning if "quota: off" in line else log.info)("%s", line)


@worker_ready.connect
def _serve_metrics(sender: Any = None, **_: object) -> None:
    # The main process serves /metrics from a thread: the sum of its pool children's
    # counts (and its own: the start-up sweep's).  A taken port is logged, not fatal.
    global _metrics_server
    root = _ours(sender)
    if root is None or _metrics_dir is None or _metrics_server is not None:
        return
    from orchestrator.core.metrics import serve_multiprocess

    settings = root.settings
    _metrics_server = serve_multiprocess(_metrics_dir, settings.telemetry.metrics_host, settings.telemetry.metrics_port)


# This worker as its host (workers/host.py): registered and beaten from the main process
# only (worker_ready and worker_shutdown are sent there, never in a pool child).  Connected
# before the start-up sweep: the host is registered first.
@worker_ready.connect
def _register_host(sender: Any = None, **_: object) -> None:
    root = _ours(sender)
    if root is None:
        return  # another app's worker in this process (a test's embedded one)
    if not consumes_runs(root.celery):
        # A worker of deliveries alone (`up`'s deliverer, compose's) is no host: groups are
        # placed on hosts (store/placement.py), and its row would be taken from the host's
        # agent worker by the shared host id.
        log.info("this worker takes no agent runs: no host row, no recovery watch")
        return
    from workers import host

    host.start(root.settings, concurrency=host.concurrency(sender))


@worker_ready.connect
def _sweep_at_start(sender: Any = None, **_: object) -> None:
    root = _ours(sender)
    if root is not None:
        from workers import host

        host.sweep_at_start(root.settings)


@worker_shutting_down.connect
def _host_draining(**_: object) -> None:
    # In Celery's signal handler: only flags are set (workers/host.py).
    if _root is not None:
        from workers import host

        host.draining()


@worker_shutdown.connect
def _host_stopped(sender: Any = None, **_: object) -> None:
    if _ours(sender) is not None:
        from workers import host

        host.stop()


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
