"""Prometheus metrics (orchestrator/core/metrics.py), counted by the real run path.

A pipeline with the fake sandbox (``fakes/sandbox.py``) and a clock that
jumps, ingest, the deliverer with a recording channel, the sweeper and the API's
``GET /metrics``, on both databases.  The registry is the process's own (every
test in the process counts into it), so each test compares before and after.
The worker's multiprocess endpoint is tested with a real worker process in
``tests/integration/test_end_to_end.py`` (``-k metrics``).
"""

from __future__ import annotations

import json
import re
import threading
from datetime import timedelta
from pathlib import Path

import pytest
from fastapi.testclient import TestClient
from prometheus_client import REGISTRY
from prometheus_client.parser import text_string_to_metric_families
from sqlalchemy import select, update

from agent_runner.protocol import AssistantEvent, ResultEvent
from fakes.channel import RecordingChannel, attach_recorder
from fakes.clock import FakeClock
from fakes.sandbox import FakeSandbox, Script
from orchestrator.core.errors import RateLimited
from orchestrator.core.settings import Settings
from orchestrator.http.api import create_app
from orchestrator.http.endpoint import CLIENT_HEADER
from orchestrator.http.fleet_metrics import FleetCollector
from orchestrator.root import Orchestrator
from orchestrator.run.ingest import IncomingMessage, ingest
from orchestrator.run.outbound import ChannelRegistry, Deliverer
from orchestrator.run.pipeline import Pipeline
from orchestrator.run.sweeper import sweep
from orchestrator.store import hosts
from orchestrator.store.attachments import attach_channel
from orchestrator.store.db import Database
from orchestrator.store.groups import ensure_main_group
from orchestrator.store.runs import create_run, get_run
from orchestrator.store.tables import GroupRow, MessageRow, RunRow

JID = "main@local"
OK = Script([AssistantEvent(text="done"), ResultEvent()])
CRASH = Script([], exit_code=1, stderr="boom")


def value(name: str, **labels: str) -> float:
    return REGISTRY.get_sample_value(name, labels) or 0.0


class Counts:
    """The samples named, read now; ``delta`` says how each moved since."""

    def __init__(self, *samples: tuple[str, dict[str, str]]) -> None:
        self.samples = samples
        self.before = [value(n, **labels) for n, labels in samples]

    def delta(self) -> list[float]:
        return [value(n, **labels) - b for (n, labels), b in zip(self.samples, self.before, strict=True)]


def _pipeline(settings: Settings, db: Database, sandbox: FakeSandbox, **changes: object) -> Pipeline:
    s = settings.replace(**{"max_attempts": 3, "retry_base_s": 10.0, "retry_max_s": 60.0, **changes})
    ensure_main_group(db)
    rec = attach_recorder(db, JID)
    return Pipeline(s, db, ChannelRegistry([rec]), sandbox, clock=FakeClock())


def _say(p: Pipeline, text: str = "hello", **fields: object) -> None:
    ingest(
        p.db,
        p.settings,
        IncomingMessage(chat_jid=JID, sender="u", content=text, **fields),  # type: ignore[arg-type]
        signal=None,
    )


def test_a_run_counts_its_start_end_duration_container_first_reply_and_deliveries(
    settings: Settings, db: Database
) -> None:
    p = _pipeline(settings, db, FakeSandbox(OK))
    counts = Counts(
        ("orchestrator_messages_ingested_total", {"wakes": "yes"}),
        ("orchestrator_runs_started_total", {}),
        ("orchestrator_runs_finished_total", {"state": "succeeded"}),
        ("orchestrator_run_duration_seconds_count", {}),
        ("orchestrator_container_start_seconds_count", {"mode": "cold"}),
        ("orchestrator_container_start_seconds_count", {"mode": "warm"}),
        ("orchestrator_run_first_reply_seconds_count", {}),
        ("orchestrator_deliveries_total", {"channel": "recorder", "state": "sent"}),
        ("orchestrator_delivery_seconds_count", {"channel": "recorder"}),
    )
    duration_sum = value("orchestrator_run_duration_seconds_sum")
    _say(p)
    [outcome] = p.drain_group(JID)
    assert outcome.run.state == "succeeded"
    # The person's message and the reply each delivered once to the recorder.
    assert counts.delta() == [1, 1, 1, 1, 1, 0, 1, 2, 2]
    run = get_run(db, outcome.run.id)
    assert run.duration_s is not None
    assert value("orchestrator_run_duration_seconds_sum") - duration_sum == pytest.approx(run.duration_s)


def test_the_queue_wait_and_the_wait_for_a_first_reply_start_when_the_message_was_stored(
    settings: Settings, db: Database
) -> None:
    p = _pipeline(settings, db, FakeSandbox(OK))
    _say(p, "first")
    _say(p, "second")
    # The older message waited 40 s before any worker looked (moved back on the
    # database's clock); the newer one counts in no wait of its own.
    with db.write() as session:
        stored = session.execute(
            select(MessageRow.seq, MessageRow.stored_at).where(MessageRow.chat_jid == JID).order_by(MessageRow.seq)
        ).all()
        assert [at is not None for _, at in stored] == [True, True]
        oldest = stored[0].stored_at - timedelta(seconds=40)
        session.execute(update(MessageRow).where(MessageRow.seq == stored[0].seq).values(stored_at=oldest))
    counts = Counts(
        ("orchestrator_queue_wait_seconds_count", {}), ("orchestrator_message_first_reply_seconds_count", {})
    )
    waited = value("orchestrator_queue_wait_seconds_sum")
    to_reply = value("orchestrator_message_first_reply_seconds_sum")
    [outcome] = p.drain_group(JID)
    assert outcome.run.state == "succeeded"
    assert counts.delta() == [1, 1]
    created = get_run(db, outcome.run.id).created_at
    assert value("orchestrator_queue_wait_seconds_sum") - waited == pytest.approx(
        (created - oldest).total_seconds(), abs=0.01
    )
    reply_wait = value("orchestrator_message_first_reply_seconds_sum") - to_reply
    assert 40 <= (created - oldest).total_seconds() <= reply_wait < 70


def test_messages_stored_before_their_storing_time_was_kept_count_in_no_wait(settings: Settings, db: Database) -> None:
    p = _pipeline(settings, db, FakeSandbox(OK))
    _say(p)
    with db.write() as session:  # as every row stored before revision 0012
        session.execute(update(MessageRow).where(MessageRow.chat_jid == JID).values(stored_at=None))
    counts = Counts(
        ("orchestrator_runs_started_total", {}),
        ("orchestrator_queue_wait_seconds_count", {}),
        ("orchestrator_run_first_reply_seconds_count", {}),
        ("orchestrator_message_first_reply_seconds_count", {}),
    )
    [outcome] = p.drain_group(JID)
    assert outcome.run.state == "succeeded"
    assert counts.delta() == [1, 0, 1, 0]


def test_a_failing_run_is_one_run_of_several_container_starts(settings: Settings, db: Database) -> None:
    p = _pipeline(settings, db, FakeSandbox(CRASH))
    counts = Counts(
        ("orchestrator_runs_started_total", {}),
        ("orchestrator_runs_finished_total", {"state": "failed"}),
        ("orchestrator_runs_finished_total", {"state": "succeeded"}),
        ("orchestrator_container_start_seconds_count", {"mode": "cold"}),
        ("orchestrator_run_first_reply_seconds_count", {}),
    )
    _say(p)
    [outcome] = p.drain_group(JID)
    assert outcome.run.state == "failed"
    assert counts.delta() == [1, 1, 0, 3, 0]  # three attempts, no reply


def test_a_lost_lease_is_counted_and_the_closed_run_too(settings: Settings, db: Database) -> None:
    sandbox = FakeSandbox(Script([], hang=True), OK)
    p = _pipeline(settings, db, sandbox)
    counts = Counts(("orchestrator_lease_losses_total", {}), ("orchestrator_runs_finished_total", {"state": "failed"}))
    _say(p)
    thread = threading.Thread(target=p.drain_group, args=(JID,), name="drain")
    thread.start()
    assert sandbox.agent_started.wait(30) and sandbox.agents[0].started_reading.wait(30)
    with db.write() as session:
        session.execute(update(GroupRow).where(GroupRow.chat_jid == JID).values(lease_owner="another-worker"))
    thread.join(30)
    assert not thread.is_alive()
    assert counts.delta() == [1, 0]  # given up, not ended, by the replaced holder
    with db.write() as session:
        session.execute(update(GroupRow).where(GroupRow.chat_jid == JID).values(lease_owner=None))
    _pipeline(settings, db, sandbox).drain_group(JID)
    assert counts.delta() == [1, 1]  # the new holder closed it as failed


def test_a_group_over_its_quota_counts_a_quota_wait(settings: Settings, db: Database) -> None:
    p = _pipeline(settings, db, FakeSandbox(OK), group_runs_per_hour=1)
    counts = Counts(
        ("orchestrator_quota_waits_total", {"quota": "runs_per_hour"}), ("orchestrator_runs_started_total", {})
    )
    _say(p)
    p.drain_group(JID)
    _say(p, "again")
    step = p.step(JID)
    assert step.quota is not None and step.quota.quota == "runs_per_hour"
    assert counts.delta() == [1, 1]


def test_ingest_counts_stored_messages_by_whether_they_wake_and_refused_senders(
    settings: Settings, db: Database
) -> None:
    s = settings.replace(**{"sender_messages_per_minute": 1})
    ensure_main_group(db)
    counts = Counts(
        ("orchestrator_messages_ingested_total", {"wakes": "yes"}),
        ("orchestrator_messages_ingested_total", {"wakes": "no"}),
        ("orchestrator_sender_refusals_total", {}),
    )
    ingest(db, s, IncomingMessage(chat_jid=JID, sender="u", content="hi", id="m1"), signal=None)
    ingest(db, s, IncomingMessage(chat_jid=JID, sender="u", content="hi", id="m1"), signal=None)  # a duplicate
    ingest(db, s, IncomingMessage(chat_jid="nobody@local", sender="v", content="hi"), signal=None)  # wakes no one
    with pytest.raises(RateLimited):
        ingest(db, s, IncomingMessage(chat_jid=JID, sender="u", content="more"), signal=None)
    assert counts.delta() == [1, 1, 1]


def test_deliveries_count_retries_and_sends_and_time_the_send(settings: Settings, db: Database) -> None:
    s = settings.replace(**{"delivery_retry_base_s": 0.0, "delivery_retry_max_s": 0.0})
    ensure_main_group(db)
    attach_channel(db, JID, "flaky")
    channel = RecordingChannel("flaky", fail_times=1)
    counts = Counts(
        *[
            ("orchestrator_deliveries_total", {"channel": "flaky", "state": st})
            for st in ("sent", "retried", "failed", "cancelled")
        ],
        ("orchestrator_delivery_seconds_count", {"channel": "flaky"}),
    )
    ingest(db, s, IncomingMessage(chat_jid=JID, sender="u", content="hi"), signal=None)
    report = Deliverer(db, s, ChannelRegistry([channel])).deliver_due(JID)
    assert (report.sent, report.failed_attempts) == (1, 1)
    assert counts.delta() == [1, 1, 0, 0, 2]  # two send calls timed, the failed one too


def test_a_sweep_counts_what_it_did(settings: Settings, db: Database) -> None:
    ensure_main_group(db)
    # A run whose worker is gone: its group has no lease holder.
    run = create_run(db, chat_jid=JID, cursor_from=0, cursor_to=0, celery_task_id=None, owner="gone:1:x")
    counts = Counts(
        ("orchestrator_sweeper_actions_total", {"action": "interrupted_runs"}),
        ("orchestrator_runs_finished_total", {"state": "failed"}),
    )
    report = sweep(db, signal=None)
    assert report.interrupted_runs == [run.id]
    assert counts.delta() == [1, 1]


@pytest.mark.parametrize("token", ["", "s3cret"])
def test_the_api_serves_its_metrics_behind_the_api_token(settings: Settings, db: Database, token: str) -> None:
    ensure_main_group(db)
    auth = {"Authorization": f"Bearer {token}"} if token else {}
    with TestClient(
        create_app(Orchestrator(settings.replace(**{"api_token": token}))), headers={CLIENT_HEADER: "tests"}
    ) as client:
        before = value("orchestrator_messages_ingested_total", wakes="yes")
        r = client.post("/api/messages", json={"chat_jid": JID, "sender": "u", "content": "hi"}, headers=auth)
        assert r.status_code == 201, r.text
        if token:
            assert client.get("/metrics").status_code == 401
            assert client.get("/metrics", headers={"Authorization": "Bearer wrong"}).status_code == 401
        r = client.get("/metrics", headers=auth)
    assert r.status_code == 200 and r.headers["content-type"].startswith("text/plain")
    line = f'orchestrator_messages_ingested_total{{wakes="yes"}} {before + 1}'
    assert line in r.text.splitlines(), r.text[:2000]
    assert "# TYPE orchestrator_run_duration_seconds histogram" in r.text


def _fleet_samples(text: str) -> dict[tuple[str, str], float]:
    return {
        (sample.name, sample.labels["host"]): sample.value
        for family in text_string_to_metric_families(text)
        if family.name.startswith("orchestrator_host_")
        for sample in family.samples
    }


def test_the_api_serves_each_hosts_runs_warm_containers_and_groups_as_the_database_has_them(
    settings: Settings, db: Database
) -> None:
    ensure_main_group(db)
    hosts.register(db, host_id="host-a", instance="ia", version="1", concurrency=2, warm_containers=3)
    hosts.register(db, host_id="host-b", instance="ib", version="1", concurrency=1, warm_containers=None)
    with db.write() as session:
        session.execute(update(GroupRow).where(GroupRow.chat_jid == JID).values(placed_host="host-a"))
    create_run(db, chat_jid=JID, cursor_from=0, cursor_to=1, celery_task_id=None, owner=hosts.process_owner("host-a"))
    with TestClient(create_app(Orchestrator(settings))) as client:
        first = _fleet_samples(client.get("/metrics").text)
        assert first == {
            ("orchestrator_host_up", "host-a"): 1.0,
            ("orchestrator_host_up", "host-b"): 1.0,
            ("orchestrator_host_runs", "host-a"): 1.0,
            ("orchestrator_host_runs", "host-b"): 0.0,
            # host-b's Docker did not answer: no sample rather than a made-up 0.
            ("orchestrator_host_warm_containers", "host-a"): 3.0,
            ("orchestrator_host_placed_groups", "host-a"): 1.0,
            ("orchestrator_host_placed_groups", "host-b"): 0.0,
            ("orchestrator_host_leases", "host-a"): 0.0,
            ("orchestrator_host_leases", "host-b"): 0.0,
        }
        # Read at each scrape: a host that stopped is down at once, a finished run is gone.
        hosts.mark_stopped(db, "host-a", "ia")
        with db.write() as session:
            session.execute(update(RunRow).values(state="succeeded"))
        second = _fleet_samples(client.get("/metrics").text)
    assert second[("orchestrator_host_up", "host-a")] == 0.0
    assert second[("orchestrator_host_runs", "host-a")] == 0.0


def _exposed_names(db: Database) -> set[str]:
    names: set[str] = set()
    for family in [*REGISTRY.collect(), *FleetCollector(db).collect()]:
        suffixes = {"counter": ["_total"], "histogram": ["_bucket", "_sum", "_count"]}.get(family.type, [""])
        names.update(family.name + suffix for suffix in suffixes if family.name.startswith("orchestrator_"))
    return names


def test_the_grafana_dashboard_asks_only_for_metrics_that_exist(db: Database) -> None:
    dashboard = json.loads((Path(__file__).parents[2] / "deploy" / "grafana" / "orchestrator.json").read_text())
    exprs = [t["expr"] for panel in dashboard["panels"] for t in panel.get("targets", [])]
    asked = {name for expr in exprs for name in re.findall(r"\borchestrator_[a-z_]+", expr)}
    exposed = _exposed_names(db)
    assert asked - exposed == set()
    # Every metric the orchestrator exposes is on the dashboard in some form.
    shown = {re.sub(r"_(total|bucket|sum|count)$", "", n) for n in asked}
    assert {re.sub(r"_(total|bucket|sum|count)$", "", n) for n in exposed} - shown == set()
