"""The Celery application.  Run a worker with::

    celery -A workers.app worker -Q agent,delivery
    # or: orchestrator worker
"""

from __future__ import annotations

import logging

from celery.signals import worker_process_init, worker_ready

from orchestrator.db import forget_databases
from orchestrator.queue import get_celery
from orchestrator.settings import get_settings

app = get_celery(get_settings())
log = logging.getLogger("workers")


@worker_process_init.connect
def _fresh_connections(**_: object) -> None:
    # A forked pool child must not share the parent's database connections.
    forget_databases()
    logging.getLogger("orchestrator").setLevel(get_settings().log_level)


@worker_ready.connect
def _log_quota_mode(**_: object) -> None:
    # Which way workspaces are kept under their quota here (orchestrator/quota.py).
    from orchestrator.quota import describe_mode

    line = describe_mode(get_settings())
    (log.warning if "quota: off" in line else log.info)("%s", line)


@worker_ready.connect
def _sweep_at_start(**_: object) -> None:
    # A worker that restarts after a crash finds what its predecessor left:
    # runs to close, groups to re-signal, containers to remove.
    from .tasks import _pipeline, sweep_now

    try:
        log.info("start-up sweep: %s", sweep_now())
    except Exception:  # noqa: BLE001 - a failed sweep must not stop the worker
        log.exception("start-up sweep failed")
    finally:
        # Children forked later must not inherit this process's connections.
        _pipeline.cache_clear()
        forget_databases()
