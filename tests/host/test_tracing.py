"""OpenTelemetry traces (orchestrator/core/tracing.py), with the SDK's in-memory exporter.

In process, on both databases: a message's trace from ``ingest`` through the signal,
the ``drain_group`` task (Celery's embedded worker on a real broker, the context in
the message's headers), the run, its container and each stored output, to the
delivery task; a run started by a signal of another trace (a sweeper's) still joins
the trace its messages stored, linked to the other messages of its batch and to the
task that ran it; a retried run's attempts.  In real processes: the settings read the
standard ``OTEL_*`` variables, ``orchestrator send`` with the console exporter prints
its spans on stderr, and with tracing off (the default) nothing of OpenTelemetry is
imported.  Across a real worker process: tests/integration/test_tracing.py.
"""

from __future__ import annotations

import json
import logging
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from opentelemetry.sdk.trace import ReadableSpan
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import SpanKind

from agent_runner.protocol import AssistantEvent, ContainerInput, ResultEvent, decode_input
from fakes.channel import RecordingChannel
from fakes.sandbox import FakeSandbox, Script
from orchestrator.core import tracing
from orchestrator.core.errors import SettingsError
from orchestrator.core.logs import ContextFilter, log_context
from orchestrator.core.settings import Settings
from orchestrator.root import Orchestrator
from orchestrator.run.ingest import IncomingMessage, ingest
from orchestrator.run.outbound import ChannelRegistry
from orchestrator.run.queue import DELIVER_TASK, DRAIN_TASK
from orchestrator.store.attachments import attach_channel
from orchestrator.store.db import Database
from orchestrator.store.groups import MAIN_JID, ensure_main_group
from orchestrator.store.message_log import get_messages_after
from orchestrator.store.runs import list_runs
from orchestrator.store.traces import batch_traces
from tests.host import test_worker_tasks as worker_tasks

ROOT = Path(__file__).resolve().parents[2]
JID = MAIN_JID
REPLY = Script([AssistantEvent(text="done"), ResultEvent()])
# The embedded worker on a real broker of tests/host/test_worker_tasks.py: ``start(sandbox, *channels)``.
tasks_module, broker_settings, start = worker_tasks.tasks_module, worker_tasks.broker_settings, worker_tasks.start
CRASH = Script([], exit_code=1, stderr="Traceback: boom")


@pytest.fixture
def spans() -> Iterator[InMemorySpanExporter]:
    """This process's spans go to an in-memory exporter for the test (each as it ends)."""
    exporter = InMemorySpanExporter()
    tracing.install(exporter, service_name="tracing-test")
    yield exporter
    tracing.shutdown()


def _named(exporter: InMemorySpanExporter, name: str) -> list[ReadableSpan]:
    return [s for s in exporter.get_finished_spans() if s.name == name]


def _one(exporter: InMemorySpanExporter, name: str) -> ReadableSpan:
    found = _named(exporter, name)
    assert len(found) == 1, (name, [s.name for s in exporter.get_finished_spans()])
    return found[0]


def _ids(span: ReadableSpan) -> tuple[int, int]:
    assert span.context is not None
    return span.context.trace_id, span.context.span_id


def _parent(span: ReadableSpan) -> tuple[int, int] | None:
    return None if span.parent is None else (span.parent.trace_id, span.parent.span_id)


def _traceparent(span: ReadableSpan) -> str:
    trace_id, span_id = _ids(span)
    assert span.context is not None
    return f"00-{trace_id:032x}-{span_id:016x}-{span.context.trace_flags:02x}"


def _say(db: Database, settings: Settings, text: str, **kw: Any) -> Any:
    return ingest(db, settings, IncomingMessage(chat_jid=JID, sender="u", content=text), signal=None, **kw)


# -- in process: the pipeline, and the tasks in Celery's embedded worker --------------------


def test_a_messages_trace_runs_from_ingest_through_the_task_to_each_stored_output(
    spans: InMemorySpanExporter, start: Any, db: Database
) -> None:
    ensure_main_group(db)
    recorder = RecordingChannel("recorder")
    attach_channel(db, JID, "recorder")
    sandbox = FakeSandbox(REPLY)
    w = start(sandbox, recorder)
    ingest(db, w.root.settings, IncomingMessage(chat_jid=JID, sender="u", content="hello"), signal=w.root.signals.group)
    w.log.wait(DRAIN_TASK)
    w.log.wait(DELIVER_TASK)

    ingested = _one(spans, "ingest")
    signal, task = _one(spans, "signal drain_group"), _one(spans, "task drain_group")
    run, container = _one(spans, "run"), _one(spans, "agent container")
    [reply] = [
        s for s in _named(spans, "store assistant") if s.attributes and s.attributes["orchestrator.sender"] == "bot"
    ]
    # The chain, each span the child of the one before, across the broker's message headers.
    assert _parent(ingested) is None
    assert _parent(signal) == _ids(ingested) and signal.kind == SpanKind.PRODUCER
    assert _parent(task) == _ids(signal) and task.kind == SpanKind.CONSUMER
    assert _parent(run) == _ids(task) and run.links == ()  # its message's own task: nothing to link
    assert _parent(container) == _ids(run) and _parent(reply) == _ids(container)
    # The delivery of the reply: the same trace, under the reply's span.
    deliver_signal = [s for s in _named(spans, "signal deliver") if _parent(s) == _ids(reply)]
    assert deliver_signal and _parent(_one(spans, "task deliver")) == _ids(deliver_signal[0])
    assert {_ids(s)[0] for s in spans.get_finished_spans()} == {_ids(ingested)[0]}  # one trace

    [stored_run] = list_runs(db, chat_jid=JID)
    bot = [m for m in get_messages_after(JID, 0, db=db) if m.sender == "bot"]
    assert run.attributes and run.attributes["orchestrator.run_id"] == stored_run.id
    assert run.attributes["orchestrator.run_state"] == "succeeded"
    assert reply.attributes and reply.attributes["orchestrator.seq"] == bot[0].seq
    assert task.attributes and task.attributes["celery.task_id"] == stored_run.celery_task_id
    # What the database kept for the message, and what the container was given.
    assert batch_traces(db, JID, 0, bot[0].seq) == [_traceparent(ingested)]
    [(_, sent)] = sandbox.started
    assert sent.traceparent == _traceparent(container)


def test_a_run_started_by_another_trace_joins_the_trace_its_messages_stored(
    spans: InMemorySpanExporter, settings: Settings, db: Database
) -> None:
    """The broker is no help: the messages were stored with no signal (the broker down),
    and a task of another trace (the sweeper's re-signal) runs the group."""
    ensure_main_group(db)
    _say(db, settings, "first")
    _say(db, settings, "second, in the same batch")
    first, second = _named(spans, "ingest")
    assert _ids(first)[0] != _ids(second)[0]  # a trace per message
    root = Orchestrator(settings, sandbox=FakeSandbox(REPLY), channels=ChannelRegistry([]))
    try:
        with tracing.span("task drain_group", kind="consumer", parent=tracing.ROOT):
            root.pipeline.step(JID)
    finally:
        root.close()
    task, run = _one(spans, "task drain_group"), _one(spans, "run")
    assert _ids(task)[0] not in (_ids(first)[0], _ids(second)[0])
    # The run is in the first message's trace, under its ingest span; linked to the task that
    # ran it and to the other message it answers.
    assert _parent(run) == _ids(first)
    assert {(link.context.trace_id, link.context.span_id) for link in run.links} == {_ids(task), _ids(second)}
    reply = [s for s in _named(spans, "store assistant") if _ids(s)[0] == _ids(first)[0]]
    assert reply and _parent(reply[0]) == _ids(_one(spans, "agent container"))


def test_each_attempt_of_a_retried_run_is_a_span_of_the_messages_trace(
    spans: InMemorySpanExporter, settings: Settings, db: Database
) -> None:
    ensure_main_group(db)
    _say(db, settings, "try twice")
    ingested = _one(spans, "ingest")
    sandbox = FakeSandbox(CRASH, REPLY)
    root = Orchestrator(settings.replace(retry_base_s=0.0), sandbox=sandbox, channels=ChannelRegistry([]))
    try:
        [outcome] = root.pipeline.drain_group(JID)  # two steps: the attempt parked, then its retry
    finally:
        root.close()
    assert outcome.run.state == "succeeded"
    first, second = sorted(_named(spans, "run"), key=lambda s: s.start_time or 0)
    assert [s.attributes["orchestrator.attempt"] for s in (first, second) if s.attributes] == [1, 2]
    assert first.attributes and first.attributes["orchestrator.run_state"] == "parked"
    assert second.attributes and second.attributes["orchestrator.run_state"] == "succeeded"
    assert _parent(first) == _parent(second) == _ids(ingested)
    # The crashed container's span says how it ended; each attempt's input named its own span.
    crashed, answered = sorted(_named(spans, "agent container"), key=lambda s: s.start_time or 0)
    assert crashed.attributes and crashed.attributes["orchestrator.exit_code"] == 1
    assert [inp.traceparent for _, inp in sandbox.started] == [_traceparent(crashed), _traceparent(answered)]


def test_a_failed_run_is_an_error_span(spans: InMemorySpanExporter, settings: Settings, db: Database) -> None:
    ensure_main_group(db)
    _say(db, settings, "fail")
    root = Orchestrator(settings.replace(max_attempts=1), sandbox=FakeSandbox(CRASH), channels=ChannelRegistry([]))
    try:
        root.pipeline.drain_group(JID)
    finally:
        root.close()
    run = _one(spans, "run")
    assert not run.status.is_ok and "status 1" in (run.status.description or "")
    # The 🏠 message the run ended with is stored under the run itself.
    assert _parent(_one(spans, "store host")) == _ids(run)


def test_tracing_off_stores_no_context_and_makes_no_span(settings: Settings, db: Database) -> None:
    ensure_main_group(db)
    assert not tracing.enabled()
    msg = _say(db, settings, "untraced").message
    assert batch_traces(db, JID, 0, msg.seq) == []
    with tracing.span("nothing"):
        assert tracing.traceparent() == "" and tracing.trace_id() == "" and tracing.headers() is None


def test_log_lines_carry_the_current_trace(spans: InMemorySpanExporter) -> None:
    check = ContextFilter(host="h")

    def record() -> logging.LogRecord:
        r = logging.LogRecord("orchestrator.test", logging.INFO, __file__, 1, "line", None, None)
        check.filter(r)
        return r

    assert record().trace_id == ""  # type: ignore[attr-defined]
    with tracing.span("ingest"):
        inside = record()
        with log_context(trace_id="given"):
            given = record()
    assert inside.trace_id == f"{_ids(_one(spans, 'ingest'))[0]:032x}"  # type: ignore[attr-defined]
    assert inside.context.endswith(f"[trace_id={inside.trace_id}]")  # type: ignore[attr-defined]
    assert given.trace_id == "given"  # type: ignore[attr-defined]


def test_a_traceparent_that_does_not_parse_starts_a_new_trace(spans: InMemorySpanExporter) -> None:
    with tracing.span("task drain_group", parent="00-garbage"):
        pass
    with tracing.span("run", join=["not a traceparent"]):
        pass
    task, run = _one(spans, "task drain_group"), _one(spans, "run")
    assert _parent(task) is None and _parent(run) is None and run.links == ()


# -- the protocol field ---------------------------------------------------------------------


def test_the_inputs_traceparent_is_optional_and_left_out_when_unset() -> None:
    plain = ContainerInput(run_id="r", chat_jid=JID, group_folder="main", assistant_name="Andy", messages=[])
    assert b"traceparent" not in plain.to_json()  # what a runner from before the field reads
    old = plain.to_json()
    assert decode_input(old) == plain  # an input recorded before the field
    traced = plain.replace(traceparent="00-" + "1" * 32 + "-" + "2" * 16 + "-01")
    assert decode_input(traced.to_json()).traceparent == traced.traceparent


# -- settings and real processes ------------------------------------------------------------


def test_the_settings_read_the_standard_otel_variables() -> None:
    s = Settings.load(
        environ={
            "OTEL_TRACES_EXPORTER": "console, otlp",
            "OTEL_SERVICE_NAME": "fleet-a",
            "OTEL_EXPORTER_OTLP_ENDPOINT": "http://collector:4318",
            "ORCHESTRATOR_OTEL_SERVICE_NAME": "not this one",
        },
        env_file=None,
    )
    assert (s.telemetry.trace_exporters, s.telemetry.otel_service_name) == (["console", "otlp"], "fleet-a")
    assert s.telemetry.otel_exporter_otlp_endpoint == "http://collector:4318"
    assert Settings.load(environ={}, env_file=None).telemetry.trace_exporters == []  # none by default
    assert Settings.load(environ={"OTEL_TRACES_EXPORTER": "none"}, env_file=None).telemetry.trace_exporters == []
    with pytest.raises(SettingsError, match="OTEL_TRACES_EXPORTER='jaeger'"):
        Settings.load(environ={"OTEL_TRACES_EXPORTER": "jaeger"}, env_file=None)


def _cli_env(tmp_path: Path, **extra: str) -> dict[str, str]:
    clean = {k: v for k, v in os.environ.items() if not k.startswith(("ORCHESTRATOR_", "OTEL_"))}
    return clean | {"ORCHESTRATOR_DATA_DIR": str(tmp_path / "data"), "PYTHONPATH": str(ROOT)} | extra


def _main_group(tmp_path: Path) -> Database:
    settings = Settings.load(data_dir=tmp_path / "data", env_file=None)
    settings.ensure_dirs()
    db = Database(settings.effective_database_url, lock_dir=settings.data_dir)
    db.migrate()
    ensure_main_group(db)
    return db


def test_send_with_the_console_exporter_prints_its_spans_on_stderr(tmp_path: Path) -> None:
    db = _main_group(tmp_path)
    done = subprocess.run(
        [str(Path(sys.executable).parent / "orchestrator"), "send", JID, "traced", "--json"],
        env=_cli_env(tmp_path, OTEL_TRACES_EXPORTER="console", OTEL_SERVICE_NAME="cli-test"),
        capture_output=True,
        text=True,
        timeout=120,
        cwd=tmp_path,
    )
    assert done.returncode == 0, done.stderr
    assert "traceparent" not in done.stdout and "trace_id" not in done.stdout  # stdout stays the CLI's data
    printed = [json.loads(line) for line in done.stderr.splitlines() if line.startswith('{"name"')]
    by_name = {s["name"]: s for s in printed}
    assert set(by_name) == {"ingest", "signal drain_group"}, done.stderr
    ingested, signal = by_name["ingest"], by_name["signal drain_group"]
    assert signal["parent_id"] == ingested["context"]["span_id"]
    assert signal["context"]["trace_id"] == ingested["context"]["trace_id"]
    assert ingested["resource"]["attributes"]["service.name"] == "cli-test"
    assert ingested["attributes"]["orchestrator.triggered"] is True
    # The message keeps the ingest span's context for its run.
    msg = get_messages_after(JID, 0, db=db)[-1]
    trace_id, span_id = ingested["context"]["trace_id"][2:], ingested["context"]["span_id"][2:]
    [stored] = batch_traces(db, JID, 0, msg.seq)
    assert stored.startswith(f"00-{trace_id}-{span_id}-")
    db.dispose()


OFF = """
import atexit, sys
atexit.register(lambda: print(sorted(m for m in sys.modules if m.startswith("opentelemetry")), file=sys.stderr))
from orchestrator.cli.entry import main
sys.argv = ["orchestrator", "send", "main@local", "untraced"]
main()
"""


def test_with_tracing_off_send_imports_nothing_of_opentelemetry(tmp_path: Path) -> None:
    _main_group(tmp_path).dispose()
    done = subprocess.run(
        [sys.executable, "-c", OFF], env=_cli_env(tmp_path), capture_output=True, text=True, timeout=120, cwd=tmp_path
    )
    assert done.returncode == 0, done.stderr
    assert done.stderr.strip().splitlines()[-1] == "[]", done.stderr
