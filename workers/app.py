"""The Celery application.  Run a worker with::

    celery -A workers.app worker -Q agent,delivery
    # or: orchestrator worker

``orchestrator`` is this process's composition root
(``orchestrator/root.py``): the tasks take the database, the pipeline and
the signals from it.
"""

from __future__ import annotations

import logging

from celery.exceptions import SoftTimeLimitExceeded
from celery.signals import worker_init, worker_process_init, worker_ready

from orchestrator.root import Orchestrator

orchestrator = Orchestrator.from_environment(deadline_exceptions=(SoftTimeLimitExceeded,))
app = orchestrator.celery
log = logging.getLogger("workers")


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
