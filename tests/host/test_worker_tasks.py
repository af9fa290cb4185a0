"""The Celery tasks of ``workers/tasks.py`` in a real, in-process worker, over a real broker.

The worker is Celery's own embedded one (``celery.contrib.testing.worker.start_worker``:
the real ``WorkController``, solo pool, in a thread), consuming the root's
Celery app as ``orchestrator/run/queue.py`` configures it (queues, routes,
acks, serializer) on a real broker: ``[sqlite]`` with the embedded
``filesystem://`` broker under the test's data dir, ``[postgresql]`` with
Redis on loopback (``tests/conftest.py``'s ``REDIS_URL``; its keys under a
prefix of this test's own, removed afterwards).  The tasks are the worker's
own, registered on that app for a root whose sandbox is the fake of
``fakes/sandbox.py`` and whose channels record what they are given
(``workers.tasks.register``).  Signals go out as everywhere else, through
the root's ``Signals``; what a task returned is read from Celery's
``task_postrun`` signal (the app keeps no results).

Why not pytest-celery: its worker fixtures (``celery_worker``, ``celery_setup``)
run workers, brokers and backends in Docker containers built from images of
their own, which these host tests neither need nor may build; its legacy
``celery_app`` fixture (re-exported from ``celery.contrib.pytest``) makes a
test app with a memory broker and its own configuration instead of the
root's.  ``celery.contrib.testing`` runs the real worker on the real app.
"""

from __future__ import annotations

import contextlib
import importlib
import sys
import threading
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from types import ModuleType
from typing import Any

import msgspec
import pytest
from celery.contrib.testing.worker import start_worker
from celery.signals import task_postrun

from agent_runner.protocol import AssistantEvent, ResultEvent
from fakes.channel import RecordingChannel
from fakes.sandbox import FakeSandbox, Script
from orchestrator.core.settings import Settings
from orchestrator.root import Orchestrator
from orchestrator.run.egress_log import run_egress
from orchestrator.run.ingest import IncomingMessage, ingest
from orchestrator.run.outbound import ChannelRegistry
from orchestrator.run.queue import DELIVER_TASK, DRAIN_TASK, SWEEP_TASK
from orchestrator.store.attachments import attach_channel
from orchestrator.store.db import Database
from orchestrator.store.deliveries import list_deliveries
from orchestrator.store.groups import MAIN_JID, ensure_main_group
from orchestrator.store.message_log import get_messages_after
from orchestrator.store.runs import create_run, get_run, list_runs
from tests.conftest import REDIS_URL, redis_available, require_service
from tests.host.test_egress_log_retention import egress_record

JID = MAIN_JID
REPLY = Script([AssistantEvent(text="done"), ResultEvent()])


@dataclass
class Finished:
    task_id: str
    name: str
    state: str
    retval: Any


class TaskLog:
    """Every task the worker finished, in order (Celery's ``task_postrun``)."""

    def __init__(self) -> None:
        self.done: list[Finished] = []
        self._cond = threading.Condition()

    def __call__(self, task_id: str, task: Any, retval: Any = None, state: str = "", **_: Any) -> None:
        with self._cond:
            self.done.append(Finished(task_id, task.name, state, retval))
            self._cond.notify_all()

    def wait(self, name: str, count: int = 1, timeout: float = 30) -> list[Finished]:
        """The first ``count`` finished tasks named ``name`` (waiting for them)."""

        def named() -> list[Finished]:
            return [f for f in self.done if f.name == name]

        with self._cond:
            if not self._cond.wait_for(lambda: len(named()) >= count, timeout):
                raise AssertionError(f"{count} × {name} not finished within {timeout}s; done: {self.done}")
            return named()[:count]


@dataclass
class Worker:
    root: Orchestrator
    tasks: Any  # workers.tasks.Tasks on the root's app
    log: TaskLog


@pytest.fixture(scope="module")
def tasks_module(tmp_path_factory: pytest.TempPathFactory) -> ModuleType:
    """``workers.tasks``, imported with the data dir at a scratch folder, not ./data
    (importing builds nothing; a root built from the environment would use it)."""
    if "workers.tasks" not in sys.modules:
        with pytest.MonkeyPatch.context() as env:
            env.setenv("ORCHESTRATOR_DATA_DIR", str(tmp_path_factory.mktemp("environment-root")))
            importlib.import_module("workers.tasks")
    return sys.modules["workers.tasks"]


@pytest.fixture
def broker_settings(settings: Settings, db_backend: str) -> Settings:
    """The test's settings with its broker: filesystem:// beside SQLite, Redis beside PostgreSQL."""
    if db_backend == "sqlite":
        return settings
    require_service(redis_available(), f"a Redis server at {REDIS_URL}")
    return settings.replace(**{"broker_url": REDIS_URL})


@pytest.fixture
def start(tasks_module: ModuleType, broker_settings: Settings, db: Database) -> Iterator[Any]:
    """``start(sandbox, *channels)``: a root with those parts and a worker running its tasks."""
    redis_prefixes: list[str] = []
    with contextlib.ExitStack() as stack:

        def starter(sandbox: FakeSandbox, *channels: RecordingChannel) -> Worker:
            root = Orchestrator(broker_settings, sandbox=sandbox, channels=ChannelRegistry(channels))
            stack.callback(root.close)
            app = root.celery
            if broker_settings.broker_url:
                # Queues of this test's own on a shared server.
                prefix = f"orchestrator-test-{uuid.uuid4().hex[:12]}:"
                redis_prefixes.append(prefix)
                app.conf.broker_transport_options = {**app.conf.broker_transport_options, "global_keyprefix": prefix}
            tasks = tasks_module.register(app, root)
            log = TaskLog()
            task_postrun.connect(log, weak=False)
            stack.callback(task_postrun.disconnect, log)
            stack.enter_context(
                start_worker(app, pool="solo", perform_ping_check=False, shutdown_timeout=30, loglevel="WARNING")
            )
            return Worker(root, tasks, log)

        yield starter
    if redis_prefixes:
        import redis

        client = redis.Redis.from_url(REDIS_URL)
        for prefix in redis_prefixes:
            for key in client.scan_iter(match=f"{prefix}*"):
                client.delete(key)
        client.close()


def _bot(db: Database) -> list[str]:
    return [m.content for m in get_messages_after(JID, 0, db=db) if m.sender == "bot"]


def test_drain_group_runs_the_pending_message_and_stores_the_reply(start: Any, db: Database) -> None:
    ensure_main_group(db)
    recorder = RecordingChannel("recorder")
    attach_channel(db, JID, "recorder")
    sandbox = FakeSandbox(REPLY)
    w = start(sandbox, recorder)
    # The channel's own message: not mirrored back to it; the drain signal goes through the broker.
    ingest(
        db,
        w.root.settings,
        IncomingMessage(chat_jid=JID, sender="u", content="hello there", channel="recorder"),
        signal=w.root.signals.group,
    )

    [drained] = w.log.wait(DRAIN_TASK)
    assert drained.state == "SUCCESS", drained.retval
    [run] = list_runs(db, chat_jid=JID)
    # Two outputs: the reply and the run's result_meta record.
    assert drained.retval == {
        "chat_jid": JID,
        "run": {"id": run.id, "state": "succeeded", "attempts": 1, "outputs": 2},
        "more": False,
        "retry_in": None,
        "busy": False,
    }
    assert run.celery_task_id == drained.task_id  # the task's request id reached the run
    assert _bot(db) == ["done"]
    [(_, sent_input)] = sandbox.started
    assert sent_input.run_id == run.id and "hello there" in msgspec.json.encode(sent_input.messages).decode()
    # The reply's delivery signal: the deliver task sends it to the group's channel.
    w.log.wait(DELIVER_TASK)
    assert recorder.rendered and recorder.rendered[-1].endswith("done")
    assert [(d.channel, d.state) for d in list_deliveries(db, chat_jid=JID)] == [("recorder", "sent")]


def test_deliver_sends_due_deliveries_and_reschedules_a_failed_one(start: Any, db: Database) -> None:
    ensure_main_group(db)
    steady, flaky = RecordingChannel("steady"), RecordingChannel("flaky", fail_times=1)
    for name in ("steady", "flaky"):
        attach_channel(db, JID, name)
    w = start(FakeSandbox(REPLY), steady, flaky)
    msg = ingest(
        db,
        w.root.settings,
        IncomingMessage(chat_jid=JID, sender="u", content="to every channel"),
        signal=None,
        signal_delivery=w.root.signals.delivery,
    ).message

    first, second = w.log.wait(DELIVER_TASK, count=2)
    assert first.state == "SUCCESS" and first.retval["chat_jid"] == JID
    assert (first.retval["sent"], first.retval["failed_attempts"]) == (1, 1)
    assert 0 < first.retval["retry_in"] <= 1.0  # flaky's first backoff (0.5-1 s): the task it scheduled ran then
    assert (second.retval["sent"], second.retval["failed_attempts"], second.retval["retry_in"]) == (1, 0, None)
    assert steady.rendered == flaky.rendered and len(steady.rendered) == 1 and "to every channel" in steady.rendered[0]
    assert flaky.calls == 2
    by_channel = {d.channel: d for d in list_deliveries(db, message_seq=msg.seq)}
    assert {c: (d.state, d.attempts) for c, d in by_channel.items()} == {"steady": ("sent", 1), "flaky": ("sent", 2)}
    assert "flaky is down" in (by_channel["flaky"].last_error or "")


class Orphans:
    """Stands in for the Docker engine the sweep looks at (``Orchestrator.docker``)."""

    def __init__(self, removes: int) -> None:
        self.removes = removes
        self.live: list[set[str]] = []

    def remove_orphans(self, live_runs: set[str]) -> int:
        self.live.append(live_runs)
        return self.removes


def test_sweep_returns_its_report(start: Any, db: Database) -> None:
    ensure_main_group(db)
    w = start(FakeSandbox(REPLY))
    orphans = Orphans(removes=2)
    w.root.docker = orphans  # type: ignore[assignment]  # the part the sweep takes, swapped like the sandbox
    # What a dead worker leaves: a pending message whose signal was lost, and its run never finished.
    msg = ingest(db, w.root.settings, IncomingMessage(chat_jid=JID, sender="u", content="anyone?"), signal=None).message
    stale = create_run(db, chat_jid=JID, cursor_from=0, cursor_to=msg.seq, celery_task_id=None)
    expired = egress_record(db, days_old=31)  # past the default retention (30 days)

    w.tasks.sweep.delay()
    [swept] = w.log.wait(SWEEP_TASK)
    assert swept.state == "SUCCESS"
    assert swept.retval == {
        "interrupted_runs": [stale.id],
        "signalled_groups": [JID],
        "removed_containers": 2,
        "abandoned_deliveries": 0,
        "delivery_signals": [],
        "freed_files": 0,
        "expired_questions": [],
        "deleted_egress_logs": 1,
    }
    assert get_run(db, stale.id).state == "failed" and orphans.live == [set()]
    assert run_egress(db, expired).decisions == []
    # The group it signalled again is drained by the same worker: the message gets its answer.
    [drained] = w.log.wait(DRAIN_TASK)
    assert drained.retval["run"]["state"] == "succeeded"
    assert _bot(db) == ["done"]


CRASH = Script([], exit_code=1, stderr="boom")


def test_a_failed_attempt_is_retried_by_a_later_task_not_slept_in_this_one(
    start: Any, db: Database, broker_settings: Settings
) -> None:
    """The run is parked (queued, retry_at) and the task ends at once; the retry
    is a signal with a countdown, taken by another task when it is due."""
    ensure_main_group(db)
    sandbox = FakeSandbox(CRASH, REPLY)
    w = start(sandbox)
    w.root.settings = broker_settings.replace(retry_base_s=1.0, retry_max_s=1.0)  # a 0.5-1 s backoff
    ingest(
        db, w.root.settings, IncomingMessage(chat_jid=JID, sender="u", content="try twice"), signal=w.root.signals.group
    )

    first, second = w.log.wait(DRAIN_TASK, count=2)
    [run] = list_runs(db, chat_jid=JID)
    assert first.retval["run"] == {"id": run.id, "state": "queued", "attempts": 2, "outputs": 0}
    assert 0.5 <= first.retval["retry_in"] <= 1.0 and first.retval["more"] is False
    assert second.task_id != first.task_id  # a new task, not a sleep in the first one
    assert second.retval["run"] == {"id": run.id, "state": "succeeded", "attempts": 2, "outputs": 2}  # reply, record
    assert (run.state, run.attempts, run.retry_at) == ("succeeded", 2, None)
    assert _bot(db) == ["done"] and len(sandbox.started) == 2


def test_one_task_runs_one_batch_and_signals_the_next(start: Any, db: Database) -> None:
    """A message that comes during a run gets its own run in a task of its own
    (Celery's time limit, sized for one run, never cuts a second one)."""
    ensure_main_group(db)
    gate = threading.Event()
    w = start(FakeSandbox(Script([AssistantEvent(text="first"), ResultEvent()], gate=gate), REPLY))
    ingest(db, w.root.settings, IncomingMessage(chat_jid=JID, sender="u", content="one"), signal=w.root.signals.group)
    sandbox = w.root.pipeline.sandbox
    assert isinstance(sandbox, FakeSandbox) and sandbox.agent_started.wait(30)
    # A second message while the first run holds the lease: its signal bounces off the lease.
    ingest(db, w.root.settings, IncomingMessage(chat_jid=JID, sender="u", content="two"), signal=w.root.signals.group)
    gate.set()
    drained = w.log.wait(DRAIN_TASK, count=2)
    runs = sorted(list_runs(db, chat_jid=JID), key=lambda r: r.created_at)
    assert [r.state for r in runs] == ["succeeded", "succeeded"]
    with_runs = [d for d in drained if d.retval["run"] is not None]
    assert [d.retval["run"]["id"] for d in with_runs] == [r.id for r in runs]
    assert with_runs[0].retval["more"] is True  # the first task saw "two" pending and signalled it
    assert len({d.task_id for d in with_runs}) == 2
