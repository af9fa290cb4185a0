"""The Celery application.  Run a worker with::

    celery -A workers.app worker -Q agent,delivery
    # or: orchestrator worker
"""

from __future__ import annotations

import logging

from celery.signals import worker_process_init

from orchestrator.db import forget_databases
from orchestrator.queue import get_celery
from orchestrator.settings import get_settings

app = get_celery(get_settings())


@worker_process_init.connect
def _fresh_connections(**_: object) -> None:
    # A forked pool child must not share the parent's database connections.
    forget_databases()
    logging.getLogger("orchestrator").setLevel(get_settings().log_level)
