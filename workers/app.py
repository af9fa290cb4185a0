"""The Celery application.  Run a worker with::

    celery -A workers.app worker -Q agent,delivery
    # or: orchestrator worker
"""

from __future__ import annotations

import logging

from celery.signals import worker_process_init, worker_ready

from orchestrator.core.settings import get_settings
from orchestrator.run.queue import get_celery
from orchestrator.store.db import forget_databases

app = get_celery(get_settings())
log = logging.getLogger("workers")


@worker_process_init.connect
def _fresh_connections(**_: object) -> None:
    # A forked pool child must not share the parent's database connections.
    forget_databases()
    logging.getLogger("orchestrator").setLevel(get_settings().log_level)


@worker_ready.connect
def _log_quota_mode(**_: object) -> None:
    # Which way workspaces are kept under their quota here (orchestrator/sandbox/quota.py).
    from orchestrator.sandbox.quota import describe_mode

    line = describe_mode(get_settings())
    (log.warning if "quota: off" in line else log.info)("%s", line)
