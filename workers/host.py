"""This worker as a host of the fleet, in its main process, from ready to shutdown.

A worker that takes agent runs registers its host in the hosts table and beats it
(``orchestrator/store/hosts.py``), and signals the groups whose lease holder is gone
or that are stranded on a host that takes no groups (``orchestrator/run/recovery.py``);
as it stops, it marks its host stopped and stops its idle warm containers.  All of it
on a root of its own, built here from the worker's settings: the pool children forked
later never touch its database or Docker connections.  Every worker, as it starts,
also sweeps what its predecessor left (on a root closed right after).

``workers/app.py`` calls these from Celery's signals, for the worker's own app only.
"""

from __future__ import annotations

import logging
from typing import Any

from orchestrator.core.settings import Settings
from orchestrator.root import Orchestrator
from orchestrator.run.recovery import RecoveryWatch
from orchestrator.store.hosts import HostHeartbeat
from workers.tasks import sweep_report

log = logging.getLogger("workers")

# The host's root and heartbeat, and its recovery watch: the main process's, while it runs.
_host: tuple[Orchestrator, HostHeartbeat] | None = None
_watch: RecoveryWatch | None = None


def concurrency(consumer: Any) -> int:
    """The pool size of the worker ``consumer`` belongs to (0: unknown)."""
    controller = getattr(consumer, "controller", None)
    n = getattr(controller, "concurrency", None) or getattr(getattr(consumer, "pool", None), "num_processes", None)
    return n if isinstance(n, int) else 0


def start(settings: Settings, *, concurrency: int) -> None:
    """Register this worker's host and beat it, then start the recovery watch (once)."""
    global _host
    if _host is not None:
        return
    root = Orchestrator(settings)
    try:
        _host = (root, root.host_heartbeat(concurrency=concurrency))
        log.info(
            "host %s registered (heartbeat every %.0fs)", root.settings.fleet.effective_host_id, _host[1].interval_s
        )
    except Exception:  # a worker without a host row still works
        log.exception("could not start the host heartbeat")
        root.close()
        return
    _start_recovery_watch(root)


def _start_recovery_watch(root: Orchestrator) -> None:
    global _watch
    try:
        _watch = root.recovery_watch()
    except Exception:  # the sweeper still recovers, only later
        log.exception("could not start the recovery watch")


def _stop_recovery_watch() -> None:
    global _watch
    if _watch is not None:
        _watch.stop()
        _watch = None


def draining() -> None:
    """The worker is shutting down warm: its host takes no new groups.  Called in Celery's
    signal handler: only flags are set here; the heartbeat thread writes."""
    if _host is not None:
        _host[1].drain()


def stop() -> None:
    """The worker stops: the recovery watch and the heartbeat end, the host is marked stopped,
    its idle containers go and the host's root is closed."""
    global _host
    if _host is None:
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
    if root.settings.sandbox.warm_idle_s <= 0:
        return
    try:
        log.info("stopped %d idle warm or standby container(s) of this host", root.stop_idle_warm_containers())
    except Exception:  # the worker stops anyway; idle containers exit on their own later
        log.exception("could not stop this host's idle warm containers")


def sweep_at_start(settings: Settings) -> None:
    """A worker that restarts after a crash finds what its predecessor left: runs to close,
    groups to re-signal, containers to remove.  On a root of its own, closed after: the pool
    children forked later must not inherit this process's database or Docker connections."""
    once = Orchestrator(settings)
    try:
        log.info("start-up sweep: %s", sweep_report(once.sweep()))
    except Exception:  # a failed sweep must not stop the worker
        log.exception("start-up sweep failed")
    finally:
        once.close()
