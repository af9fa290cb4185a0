"""The worker app of ``bench/control_plane.py``: the product's ``workers.app`` with a
sandbox that answers at once.  Run as::

    celery -A bench.instant_app worker -Q agent,delivery

Everything but the sandbox is the product's: this module imports ``workers.app``
(its composition root, its Celery app with the same tasks of ``workers/tasks.py``,
and its signal receivers) and hands that root, before any run, a sandbox whose
agent writes one assistant event and one result event and exits 0.  No Docker,
no model: what a run costs here is the control plane's own work (the database,
the broker, the pipeline's code), which is what the benchmark measures.

Every process of the worker (the main one and each pool child) counts what it
sends to PostgreSQL (``bench/query_counts.py``) into ``<data dir>/query-counts``.
A no-op task (``query_counts.NOOP_TASK``, counted there too) gives the benchmark its
baseline: what the same workers do with tasks that do nothing.
"""

from __future__ import annotations

import atexit
import os
import time
from collections.abc import Iterator
from contextlib import contextmanager

from celery.signals import worker_process_shutdown

from agent_runner.protocol import AssistantEvent, ResultEvent, Usage, dump_event
from bench import query_counts
from orchestrator.sandbox.containers import ContainerExit, ContainerSpec
from workers.app import app, worker_root

__all__ = ["app"]


class InstantAgent:
    """One run's agent: its two event lines at once, exit status 0."""

    def __init__(self, number: int) -> None:
        self.id = f"instant-{os.getpid()}-{number}"

    def lines(self, max_line_bytes: int = 0) -> Iterator[str]:
        yield dump_event(AssistantEvent(text="ok"))
        yield dump_event(ResultEvent(usage=Usage(input_tokens=1, output_tokens=1), stop_reason="end_turn", num_turns=1))

    def kill(self) -> None:
        pass

    def finish(self) -> ContainerExit:
        return ContainerExit(0, False, "")


class InstantSandbox:
    """The ``Sandbox`` port (orchestrator/sandbox/port.py) with nothing behind it."""

    def __init__(self) -> None:
        self._started = 0

    def expected_container(self, group_folder: str) -> str | None:
        return None

    @contextmanager
    def start(self, spec: ContainerSpec, payload: bytes) -> Iterator[InstantAgent]:
        self._started += 1
        yield InstantAgent(self._started)


# A cached_property of the root, filled before the pipeline (made on a pool child's
# first task) reads it: every run of this worker goes here.
root = worker_root()
root.sandbox = InstantSandbox()

query_counts.install()
query_counts.write_to(root.settings.data_dir / query_counts.FOLDER)
atexit.register(query_counts.write)


@worker_process_shutdown.connect
def _last_counts(**_: object) -> None:
    query_counts.write()  # a pool child ends without atexit


@app.task(name=query_counts.NOOP_TASK, ignore_result=True, shared=False)
def noop() -> None:
    """The baseline's task: nothing but being received, run and acknowledged, once the
    benchmark has opened the gate (its whole backlog queued)."""
    gate = root.settings.data_dir / query_counts.NOOP_GATE
    while not gate.exists():
        time.sleep(0.01)
    query_counts.count(query_counts.NOOP_TASK, 0.0)
