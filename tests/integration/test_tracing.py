"""A message's trace across real processes: the ``orchestrator send`` CLI, the broker,
a ``celery worker`` process (its prefork pool child runs the task) and the agent's
Docker container, each process exporting over OTLP/HTTP to a fake collector on
loopback (``fakes/otlp_collector.py``: the real protobuf wire format).

The parent-child chain from the CLI's ``ingest`` span to the stored reply's span is
asserted span by span, with one trace id throughout, and the worker's JSON log
line of the run's end carries that trace id (issue 15 items 4 and 5).
"""

from __future__ import annotations

import json
from collections.abc import Iterator

import pytest

from fakes.otlp_collector import FakeCollector, Span
from orchestrator.store.groups import ensure_main_group
from orchestrator.store.message_log import get_messages_after
from orchestrator.store.runs import list_runs
from orchestrator.store.traces import batch_traces
from tests.conftest import wait_until

from .conftest import Stack


@pytest.fixture
def collector() -> Iterator[tuple[FakeCollector, str]]:
    fake = FakeCollector()
    with fake.serve() as endpoint:
        yield fake, endpoint


def _bot_reply(fake: FakeCollector) -> list[Span]:
    return [s for s in fake.named("store assistant") if s.attributes.get("orchestrator.sender") == "bot"]


def test_a_messages_trace_runs_from_the_cli_through_the_worker_to_the_stored_reply(
    stack: Stack, collector: tuple[FakeCollector, str]
) -> None:
    fake, endpoint = collector
    stack.env.update(
        OTEL_TRACES_EXPORTER="otlp",
        OTEL_EXPORTER_OTLP_TRACES_ENDPOINT=endpoint,
        OTEL_SERVICE_NAME="traced",
        OTEL_BSP_SCHEDULE_DELAY="100",  # the SDK's own batching variable
        ORCHESTRATOR_LOG_FORMAT="json",
        ORCHESTRATOR_HOST_ID="traced-host",
    )
    ensure_main_group(stack.db)
    stack.start_worker()
    # Ready first: a message stored before would be signalled by the worker's start-up sweep
    # (its run then joins the message's trace under the ingest span, not under the task).
    wait_until(lambda: " ready." in stack.worker_logs(), 60, "the worker ready", stack.worker_logs)
    res = stack.cli("send", "main@local", "$ echo traced", "--wait", "90", "--json")
    assert res.returncode == 0, res.stderr + stack.worker_logs()
    wait_until(
        lambda: bool(_bot_reply(fake)) and bool(fake.named("ingest")),
        30,
        "the worker's spans at the collector",
        lambda: f"{[s.name for s in fake.spans]}\n{stack.worker_logs()}",
    )

    spans = fake.by_id()
    [ingested] = fake.named("ingest")
    [signal] = [s for s in fake.named("signal drain_group") if s.parent_id == ingested.span_id]
    [task] = [s for s in fake.named("task drain_group") if s.parent_id == signal.span_id]
    [run] = fake.named("run")
    [container] = fake.named("agent container")
    [reply] = _bot_reply(fake)
    [tool_result] = fake.named("store tool_result")
    # ingest -> signal (the CLI's process) -> task -> run -> container -> stored reply (the worker's pool child)
    assert ingested.parent_id == "" and ingested.attributes["orchestrator.triggered"] is True
    assert (signal.kind, task.kind) == ("producer", "consumer")
    assert run.parent_id == task.span_id and container.parent_id == run.span_id
    assert reply.parent_id == container.span_id and tool_result.parent_id == container.span_id
    chain = [ingested, signal, task, run, container, reply]
    assert {s.trace_id for s in chain} == {ingested.trace_id}
    assert all(s.service == "traced" for s in chain)
    assert task.resource.get("orchestrator.host") == "traced-host"
    # Every span of the run's trace hangs off the ingest span.
    for s in fake.spans:
        if s.trace_id == ingested.trace_id and s is not ingested:
            assert s.parent_id in spans, s

    [stored_run] = list_runs(stack.db, chat_jid="main@local")
    assert run.attributes["orchestrator.run_id"] == stored_run.id
    assert run.attributes["orchestrator.run_state"] == "succeeded" and not run.error
    assert container.attributes["orchestrator.container_id"] == stored_run.container_id
    assert container.attributes["orchestrator.exit_code"] == 0
    bot = [m for m in get_messages_after("main@local", 0, db=stack.db) if m.sender == "bot"]
    assert reply.attributes["orchestrator.seq"] == bot[0].seq
    # The database kept the message's context (the run's trace, whichever signal runs it).
    [stored] = batch_traces(stack.db, "main@local", 0, bot[0].seq)
    assert stored.startswith(f"00-{ingested.trace_id}-{ingested.span_id}-")

    # Item 5: the run's JSON log lines carry its trace.
    lines = [json.loads(x) for x in stack.logs[0].read_text().splitlines() if x.startswith("{")]
    [ended] = [x for x in lines if x.get("run_id") == stored_run.id and "ended succeeded" in x["message"]]
    assert ended["trace_id"] == ingested.trace_id and ended["host"] == "traced-host"
