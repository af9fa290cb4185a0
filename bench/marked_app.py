"""The worker app of ``bench/warm_stages.py``: the product's ``workers.app``, unchanged, with
the moments a task passes through the worker written down.  Run as::

    celery -A bench.marked_app worker -Q agent,delivery

Each process of the worker (the main one, which takes the message from the broker, and
the pool child, which runs the task) appends ``<wall time> <moment> <task id>`` to
``<data dir>/stage-marks`` when Celery's signals fire: ``received`` (the main process
has the message), ``prerun`` (the pool child starts the task) and ``postrun``.
"""

from __future__ import annotations

import os
import time
from typing import Any

from celery.signals import task_postrun, task_prerun, task_received

from workers.app import app

__all__ = ["app"]

_MARKS = os.path.join(os.environ["ORCHESTRATOR_DATA_DIR"], "stage-marks")


def _mark(moment: str, task_id: object) -> None:
    # One short line per write in append mode: lines from several processes do not mix.
    with open(_MARKS, "a") as marks:
        marks.write(f"{time.time():.6f} {moment} {task_id}\n")


@task_received.connect(weak=False)
def _received(request: Any = None, **_: object) -> None:
    _mark("received", getattr(request, "id", None))


@task_prerun.connect(weak=False)
def _prerun(task_id: str | None = None, **_: object) -> None:
    _mark("prerun", task_id)


@task_postrun.connect(weak=False)
def _postrun(task_id: str | None = None, **_: object) -> None:
    _mark("postrun", task_id)
